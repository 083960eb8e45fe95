"""Defects a new operator met following the README, each pinned by a regression test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Cli, isolated_cli, tasks
from helpers import closed_port, finish_issues

from dropbox_eval.errors import EXIT_FAILED, EXIT_USAGE
from dropbox_eval.sandbox import SandboxForge


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    made = isolated_cli(tmp_path, forge, monkeypatch)
    monkeypatch.setenv("SAAS_EVAL_SETTLE_SECONDS", "0")  # a closed issue finishes at once
    return made


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("SANDBOX_LANE_MODE", "bogus", ["sandbox", "--port", "0"]),
        ("SANDBOX_FLAVOR", "forgejoo", ["run", "--sandbox", "--once"]),
        ("SANDBOX_MERGE_RATIO", "abc", ["demo"]),
    ],
)
def test_a_bad_sandbox_variable_is_one_line_naming_it_exit_2(
    cli: Cli, variable: str, value: str, command: list[str]
) -> None:
    result = cli(*command, env={variable: value})
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {variable}: "), lines
    assert repr(value) in lines[0]


def _finish(cli: Cli, batch_id: str) -> None:
    finish_issues(cli.forge, json.loads(cli("batch", batch_id, "--json").stdout)["repo"])
    assert cli("poll", batch_id).exit_code == 0
    assert cli("emit", batch_id).exit_code == 0


def _listed(cli: Cli, *args: str) -> list[str]:
    result = cli("batches", "--json", *args)
    assert result.exit_code == 0, result.output
    return [row["batch_id"] for row in json.loads(result.stdout)]


def test_batches_lists_the_live_first_then_the_most_recently_ended(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "20")
    old_running = cli.submit(1)
    old_finished_late = cli.submit(2)
    newest = cli.submit(3)
    _finish(cli, newest)  # archived first, though created last
    _finish(cli, old_finished_late)  # archived last: the end of the archive file
    assert _listed(cli) == [old_running, old_finished_late, newest]
    assert _listed(cli, "--limit", "2") == [old_running, old_finished_late]
    assert _listed(cli, "--limit", "1") == [old_running]
    assert _listed(cli, "--all") == [old_running, old_finished_late, newest]
    refused = cli("batches", "--all", "--limit", "2")
    assert refused.exit_code == EXIT_USAGE and "--limit" in refused.stderr


def test_clients_show_ledger_has_balance_and_held_after_each_entry(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    _finish(cli, cli.submit(2))  # task_price 1: hold 2, charge 2, release 2
    shown = cli("clients", "show", "acme")
    assert shown.exit_code == 0, shown.output
    header = next(line for line in shown.stdout.splitlines() if "kind" in line)
    assert "balance after" in header and "held after" in header
    rows: dict[str, list[str]] = {}
    for line in shown.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[1] in ("fund", "hold", "charge", "release"):
            rows[cells[1]] = cells[2:5]  # amount, balance after, held after
    ledger = json.loads(cli("clients", "show", "acme", "--json").stdout)["ledger"]
    for entry in ledger:
        amount = entry["amount"] or entry["held_change"]
        expected = [str(amount), str(entry["balance_after"]), str(entry["held_after"])]
        assert rows[entry["kind"]] == expected, (entry, rows)
    assert rows["hold"][0] != "0" and rows["hold"][2] == rows["charge"][2] != "0"
    assert rows["release"][2] == "0"


def test_batch_table_shows_attempts_and_next_attempt(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    cli.forge.fail_next(5, 502, path_contains="/issues")
    batch_id = cli.submit(2)
    record = json.loads(cli("batch", batch_id, "--json").stdout)
    assert record["attempts"] >= 1 and record["next_attempt_at"], record
    shown = cli("batch", batch_id).stdout
    assert f"attempts: {record['attempts']}" in shown
    assert f"next attempt: {record['next_attempt_at'][:19]}" in shown
    assert "last error: " in shown


def test_a_missing_token_says_to_set_the_token_not_the_url(cli: Cli) -> None:
    result = cli("run", "--once", env={"SAAS_EVAL_GITEA_TOKEN": None})  # type: ignore[dict-item]
    assert result.exit_code == EXIT_USAGE
    message = result.stderr.strip()
    assert message.startswith("error: SAAS_EVAL_GITEA_TOKEN is not set: set it")
    assert "SAAS_EVAL_GITEA_TOKEN_FILE" in message and "point it at" not in message


def test_adding_an_existing_client_says_how_to_fund_it(cli: Cli) -> None:
    assert cli("clients", "add", "acme").exit_code == 0
    again = cli("clients", "add", "acme")
    assert again.exit_code == 1
    assert "use `dropbox-eval clients fund acme N` to add credits" in again.stderr


def test_a_file_without_client_id_says_where_to_drop_it(cli: Cli) -> None:
    assert cli("clients", "add", "acme").exit_code == 0  # submit needs a state
    source = cli.home / "anonymous.json"
    source.write_text(json.dumps({"tasks": tasks(1)}))
    result = cli("submit", str(source), "--json")
    assert result.exit_code == 4
    assert "or drop the file into inbox/<client_id>/" in result.output


def test_run_once_exits_1_when_a_forge_visit_failed(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    cli.submit(1)
    assert cli("run", "--once").exit_code == 0  # the forge answered: nothing failed
    dead = f"http://127.0.0.1:{closed_port()}"
    failed = cli("run", "--once", "--gitea-url", dead)
    assert failed.exit_code == EXIT_FAILED, failed.output
    assert "forge visit(s) failed in this pass" in failed.stderr


def test_batches_rows_have_the_same_fields_with_or_without_all(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "20")
    _finish(cli, cli.submit(1))
    paged = json.loads(cli("batches", "--json").stdout)
    everything = json.loads(cli("batches", "--json", "--all").stdout)
    assert paged == everything and "archived_at" not in paged[0]
