"""CLI conventions: help, version, flags anywhere, read-only commands, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from conftest import PATIENCE, Cli, isolated_cli, tasks, wait_for
from filelock import FileLock

from dropbox_eval import __version__
from dropbox_eval.cli import main
from dropbox_eval.errors import EXIT_CODES
from dropbox_eval.sandbox import SandboxForge


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return isolated_cli(tmp_path, forge, monkeypatch)


def _commands(group: click.Group, path: list[str]) -> Iterator[list[str]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # commands load when asked for (cli.COMMANDS)
        command = group.get_command(ctx, name)
        yield [*path, name]
        if isinstance(command, click.Group):
            yield from _commands(command, [*path, name])


def test_every_command_has_help_and_short_h(cli: Cli) -> None:
    paths = list(_commands(main, []))
    assert ["clients", "list"] in paths and ["watch"] in paths
    for path in [[], *paths]:
        for flag in ("-h", "--help"):
            result = cli(*path, flag, base=False)
            assert result.exit_code == 0 and "Usage:" in result.output, (path, result.output)


def test_version(cli: Cli) -> None:
    for flag in ("--version", "-V"):
        result = cli(flag, base=False)
        assert result.exit_code == 0 and __version__ in result.output


def test_setting_flags_work_after_the_sub_command_and_name_their_variable(cli: Cli) -> None:
    assert cli("clients", "add", "acme").exit_code == 0
    after = cli("batches", "--home", str(cli.home), "--json", base=False)
    assert after.exit_code == 0, after.output
    assert json.loads(after.stdout) == []
    assert cli("clients", "list", "--home", str(cli.home), base=False).exit_code == 0
    assert "SAAS_EVAL_STATE_DIR" in cli("batches", "-h", base=False).output
    # the sub-command's flag wins over the group's
    other = cli.home / "elsewhere"
    result = cli("--home", str(cli.home), "batches", "--home", str(other), base=False)
    assert result.exit_code == 2 and str(other) in result.output


@pytest.mark.parametrize(
    "command",
    [
        ["batches"],
        ["batch", "20260101-000000-abc"],
        ["status"],
        ["watch", "20260101-000000-abc"],
        ["clients", "list"],
        ["clients", "show"],
    ],
)
def test_read_only_commands_create_nothing_and_say_so(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    nowhere = tmp_path / "nonexistent" / "x"
    result = cli(*command, "--home", str(nowhere), base=False)
    assert result.exit_code == 2
    assert f"no dropbox-eval state at {nowhere / 'state'}" in result.output
    assert not (tmp_path / "nonexistent").exists()
    assert "Traceback" not in result.output


def test_read_only_commands_leave_an_existing_state_as_it_is(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(1)
    stale = cli.home / "state" / "batches" / ".old.tmp"
    stale.write_text("x")
    os.utime(stale, (1, 1))  # a crash's leftover: only a writing command cleans it
    before = sorted(p.relative_to(cli.home) for p in cli.home.rglob("*"))
    for command in (["batches"], ["batch", batch_id], ["clients", "list"]):
        assert cli(*command).exit_code == 0
    assert cli("status").exit_code == 3  # not running
    assert cli("watch", batch_id, "--interval", "0.05").exit_code == 1  # no service
    assert sorted(p.relative_to(cli.home) for p in cli.home.rglob("*")) == before


def test_a_state_dir_that_is_a_file_is_one_line_exit_2(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    monkeypatch.setenv("SAAS_EVAL_STATE_DIR", str(blocker))
    for command in (["batches"], ["clients", "add", "acme"], ["status"]):
        result = cli(*command)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == f"error: SAAS_EVAL_STATE_DIR: {blocker} is not a folder"


def test_status_filter_is_validated(cli: Cli) -> None:
    cli("clients", "add", "acme")
    result = cli("batches", "--status", "runing")
    assert result.exit_code == 2 and "'runing' is not one of" in result.output


def test_usage_errors_exit_2(cli: Cli) -> None:
    assert cli("clients", "add", "Acme Corp").exit_code == 2
    assert cli("clients", "add", "acme").exit_code == 0
    zero = cli("clients", "fund", "acme", "0")
    assert zero.exit_code == 2 and "0" in zero.output
    assert cli("clients", "fund", "acme", "-3").exit_code == 2


def test_submit_prints_a_table_not_python_reprs(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    source = cli.home / "one.json"
    source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(2)}))
    result = cli("submit", str(source))
    assert result.exit_code == 0
    assert "True" not in result.output and "[{" not in result.output and "{'" not in result.output
    assert "ok" in result.output and "yes" in result.output


def test_one_shot_commands_log_only_with_v_and_json_logs(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    source = cli.home / "q.json"
    source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(1)}))
    quiet = cli("submit", str(source))
    assert quiet.exit_code == 0 and quiet.stderr == ""
    source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(1, "u")}))
    loud = cli("-v", "--log-format", "json", "submit", str(source))
    assert loud.exit_code == 0
    lines = [json.loads(line) for line in loud.stderr.splitlines()]
    assert any(line["level"] == "info" and "accepted" in line["message"] for line in lines)


def test_the_token_is_never_a_flag_and_may_come_from_a_file(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = cli("--gitea-token", cli.forge.token, "poll")
    assert refused.exit_code == 2 and "No such option" in refused.output
    monkeypatch.delenv("SAAS_EVAL_GITEA_TOKEN")
    secret = cli.home / "token"
    secret.write_text(cli.forge.token + "\n")
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(1)
    assert batch_id
    polled = cli("poll", "--gitea-token-file", str(secret), "--json")
    assert polled.exit_code == 0, polled.output
    missing = cli("poll", "--gitea-token-file", str(cli.home / "nope"))
    assert missing.exit_code == 2 and "SAAS_EVAL_GITEA_TOKEN_FILE" in missing.output


def test_clients_list_has_a_table_and_json(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    cli("clients", "add", "bravo")
    table = cli("clients", "list")
    assert table.exit_code == 0 and "acme" in table.output and "bravo" in table.output
    rows = json.loads(cli("clients", "list", "--json").stdout)
    assert [(r["client_id"], r["balance"]) for r in rows] == [("acme", 10), ("bravo", 0)]


def test_cancelled_batch_shows_as_cancelled_not_a_full_bar(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(2)
    owner, name = json.loads(cli("batch", batch_id, "--json").stdout)["repo"].split("/")
    first = cli.forge.issues(owner, name)[0]["number"]
    cli.forge.finish_issue(owner, name, first, comment="ok", labels=["eval-pass"])
    polled = cli("poll")
    assert polled.exit_code == 0 and batch_id in polled.output and "finished now" in polled.output
    assert cli("cancel", batch_id).exit_code == 0
    listing = cli("batches").output
    assert "(cancelled)" in listing and "1/2 by the lane" in listing
    assert "##########" not in listing and "2/2" not in listing
    assert "1/2 by the lane" in cli("batch", batch_id).output
    cli("run", "--once")
    watched = cli("watch", batch_id, "--interval", "0.05")
    assert watched.exit_code == 0
    assert f"{batch_id}: cancelled, 1/2 by the lane" in watched.output


def test_status_of_a_stopped_service_shows_no_pid(cli: Cli) -> None:
    cli("clients", "add", "acme")
    assert cli("run", "--once").exit_code == 0
    shown = cli("status")
    assert shown.exit_code == 3
    assert "not running (stopped 20" in shown.output and "pid" not in shown.output
    assert "pid" not in json.loads(cli("status", "--json").stdout)


def test_watch_ends_when_no_service_runs(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(1)
    result = cli("watch", batch_id, "--interval", "0.05")
    assert result.exit_code == 1
    assert "service is not running" in result.output and f"{batch_id}: running" in result.output


def _subprocess_env(cli: Cli) -> dict[str, str]:
    return {**os.environ, "SAAS_EVAL_HOME": str(cli.home), "SAAS_EVAL_GITEA_URL": cli.forge.url}


def _interrupted_watch(cli: Cli, batch_id: str) -> tuple[int, str]:
    """Run `watch` in a real process while a service seems to run; Ctrl-C it once it is
    watching: its first progress line is out (before that, on a loaded machine, Python may
    still be importing and a Ctrl-C there is not the command's to handle)."""
    out_path, err_path = cli.home / "watch.out", cli.home / "watch.err"
    lock = FileLock(str(cli.home / "state" / "service.lock"))  # as if a service ran
    with lock, out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "dropbox_eval", "watch", batch_id, "--interval", "0.05"],
            env=_subprocess_env(cli),
            stdout=out,
            stderr=err,
            text=True,
        )
        try:
            watching = f"{batch_id}: running"
            assert wait_for(lambda: watching in out_path.read_text() or process.poll() is not None)
            assert not wait_for(lambda: process.poll() is not None, 1.0)  # still watching
            process.send_signal(signal.SIGINT)
            process.wait(timeout=PATIENCE)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=PATIENCE)
    return process.returncode, err_path.read_text() + out_path.read_text()


def test_ctrl_c_ends_watch_quietly_with_130(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(1)
    code, output = _interrupted_watch(cli, batch_id)
    assert code == 130
    assert "Aborted" not in output and "Traceback" not in output
    # piped, not a terminal: the progress is a line per change, not an invisible bar
    assert output.count(f"{batch_id}: running, 0/1") == 1


def test_demo_beside_a_running_service_uses_its_own_home(cli: Cli) -> None:
    cli("clients", "add", "acme")
    with FileLock(str(cli.home / "state" / "service.lock")):
        result = cli("demo", "--timeout", "60")
    assert result.exit_code == 0, result.output
    assert "the demo runs in" in result.stderr and "rm -r" in result.stderr  # and stays
    assert '"status": "completed"' in result.output or '"batch_id"' in result.output
    assert not (cli.home / "inbox" / "demo").exists()


def test_every_documented_exit_code_is_reachable(cli: Cli) -> None:
    reached = {cli("--version", base=False).exit_code}
    cli("clients", "add", "acme", "--credits", "10")
    running = cli.submit(1)
    reached.add(cli("emit", running).exit_code)  # not finished: 1
    reached.add(cli("clients", "fund", "acme", "0").exit_code)  # usage: 2
    reached.add(cli("batch", "20260101-000000-nope").exit_code)  # unknown: 3
    bad = cli.home / "bad.json"
    bad.write_text("{nope")
    reached.add(cli("submit", str(bad), "--client", "acme").exit_code)  # rejected: 4
    with FileLock(str(cli.home / "state" / "service.lock")):
        reached.add(cli("run", "--once").exit_code)  # another service: 5
        busy = cli("run", "--once", "--sandbox")
        assert busy.exit_code == 5 and "sandbox forge at" not in busy.stderr  # none started
    reached.add(_interrupted_watch(cli, running)[0])  # Ctrl-C: 130
    assert reached == set(EXIT_CODES)


# -- scripts: --json everywhere, JSON errors, status exit codes, flags, help, reference --------

SERVICES = {("run",), ("serve",)}  # they print logs (--log-format json), not data


def _every_command() -> Iterator[tuple[list[str], click.Command]]:
    for path in _commands(main, []):
        command: click.Command = main
        for name in path:
            assert isinstance(command, click.Group)
            command = command.commands[name]
        if not isinstance(command, click.Group):
            yield path, command


def test_every_command_that_prints_takes_json() -> None:
    for path, command in _every_command():
        has_json = any(p.name == "as_json" for p in command.params)
        assert has_json != (tuple(path) in SERVICES), path


def test_every_option_has_help() -> None:
    for path, command in [([], main), *_every_command()]:
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, (path, param.name)


def test_errors_under_json_are_documents_on_stdout(cli: Cli) -> None:
    cli("clients", "add", "acme")
    unknown = cli("batch", "20260101-000000-nope", "--json")
    assert unknown.exit_code == 3 and unknown.stderr == ""
    assert json.loads(unknown.stdout) == {
        "ok": False,
        "reason": "not_found",
        "message": "no batch '20260101-000000-nope'",
    }
    usage = cli("batches", "--status", "runing", "--json")
    assert usage.exit_code == 2
    document = json.loads(usage.stdout)
    assert document["ok"] is False and document["reason"] == "usage"
    assert "'runing' is not one of" in document["message"]
    zero = cli("clients", "fund", "acme", "0", "--json")
    assert zero.exit_code == 2 and json.loads(zero.stdout)["reason"] == "usage"
    bad = cli.home / "bad.json"
    bad.write_text("{nope")
    rejected = cli("submit", str(bad), "--client", "acme", "--json")
    assert rejected.exit_code == 4 and json.loads(rejected.stdout)["reason"] == "invalid_json"
    nowhere = cli("status", "--home", str(cli.home / "nowhere"), "--json", base=False)
    assert nowhere.exit_code == 2 and json.loads(nowhere.stdout)["reason"] == "not_configured"
    # the same commands without --json: one line on stderr, nothing on stdout
    plain = cli("batch", "20260101-000000-nope")
    assert plain.exit_code == 3 and plain.stdout == ""
    assert plain.stderr.startswith("error: no batch")


def test_status_exits_0_running_and_3_stopped(cli: Cli) -> None:
    cli("clients", "add", "acme")
    stopped = cli("status", "--json")
    assert stopped.exit_code == 3 and json.loads(stopped.stdout)["running"] is False
    with FileLock(str(cli.home / "state" / "service.lock")):  # as if a service ran
        running = cli("status", "--json")
    assert running.exit_code == 0 and json.loads(running.stdout)["running"] is True


def test_setting_flags_are_offered_only_where_they_are_used(cli: Cli) -> None:
    status_help = cli("status", "--help", base=False).output
    assert "--home" in status_help and "--state-dir" in status_help
    for unused in ("--gitea-url", "--owner", "--poll-interval", "--task-price", "--inbox"):
        assert unused not in status_help, unused
    sandbox_help = cli("sandbox", "--help", base=False).output
    assert "SAAS_EVAL_" not in sandbox_help
    run_help = cli("run", "--help", base=False).output
    for used in ("--home", "--gitea-url", "--owner", "--poll-interval", "--task-price"):
        assert used in run_help, used
    refused = cli("status", "--gitea-url", "http://x", base=False)
    assert refused.exit_code == 2 and "No such option '--gitea-url'" in refused.output
    # before the sub-command every setting flag is still accepted
    cli("clients", "add", "acme")
    assert cli("--poll-interval", "5", "batches", "--json").exit_code == 0


def test_the_docs_cli_reference_is_the_commands_own_help() -> None:
    from dropbox_eval.cli.reference import COMMAND, END, PAGE, START, render

    page = (Path(__file__).resolve().parent.parent / PAGE).read_text(encoding="utf-8")
    assert START in page and END in page
    shown = page[page.index(START) : page.index(END) + len(END)]
    assert shown == render(), f"{PAGE} is stale: run {COMMAND}"
