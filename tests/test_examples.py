"""examples/ and `dropbox-eval validate`: each valid example passes validate and
is accepted by a running service; each invalid one gives, in validate and in its error
file, exactly the lines written beside it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import forkrun
import pytest
from conftest import Cli, isolated_cli, read_json, running, settings_on, wait_for

from dropbox_eval.app import App, build_service
from dropbox_eval.errors import BatchRejected
from dropbox_eval.protocol.callbacks import CallbackPolicy
from dropbox_eval.sandbox import SandboxForge

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = ROOT / "examples" / "valid" / "minimal.json"
VALID = sorted((ROOT / "examples" / "valid").glob("*.json"))
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.json"))
TASK_COUNTS = {"minimal": 1, "callback": 2, "acceptance": 2, "large": 1000}


def validate(*args: str, cwd: Path = ROOT, **env: str) -> forkrun.Finished:
    """`dropbox-eval validate ARGS` as a client runs it: no SAAS_EVAL_ setting but `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    return forkrun.run(["validate", *args], clean | env, 120, cwd=cwd)


def expected(path: Path) -> list[str]:
    """The lines `validate` must print for the invalid example `path`."""
    return path.with_suffix(".expected.txt").read_text(encoding="utf-8").splitlines()


def test_the_examples_are_the_ones_the_readme_promises() -> None:
    assert {p.stem for p in VALID} == set(TASK_COUNTS)
    assert len(INVALID) >= 15
    texts = sorted((ROOT / "examples" / "invalid").glob("*.expected.txt"))
    assert [p.name.removesuffix(".expected.txt") for p in texts] == [p.stem for p in INVALID]


def test_validate_passes_every_valid_example() -> None:
    done = validate(*(str(p.relative_to(ROOT)) for p in VALID))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"examples/valid/{p.name}: ok, {TASK_COUNTS[p.stem]} task"
        + ("" if TASK_COUNTS[p.stem] == 1 else "s")
        + " for client acme"
        for p in VALID
    ]


def test_validate_prints_exactly_the_expected_lines_of_each_invalid_example() -> None:
    done = validate(*(str(p.relative_to(ROOT)) for p in INVALID))
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [line for p in INVALID for line in expected(p)]
    for path in INVALID:
        assert all(line.startswith(f"examples/invalid/{path.name}: ") for line in expected(path))


def test_one_invalid_file_among_valid_ones_fails_the_run(tmp_path: Path) -> None:
    minimal, bad = ROOT / "examples" / "valid" / "minimal.json", INVALID[0]
    done = validate(str(minimal), str(bad), "--json")
    assert done.returncode == 1
    answer = json.loads(done.stdout)
    assert answer["ok"] is False
    assert [f["ok"] for f in answer["files"]] == [True, False]
    assert answer["files"][1]["message"] == expected(bad)[0].split(": ", 1)[1]


def test_validate_needs_no_service_forge_or_state_and_writes_nothing(tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "valid" / "minimal.json", tmp_path / "batch.json")
    done = validate("batch.json", cwd=tmp_path, SAAS_EVAL_GITEA_URL="http://127.0.0.1:9")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.json"]


def test_validate_uses_the_limits_of_the_settings() -> None:
    large = "examples/valid/large.json"
    assert validate(large, SAAS_EVAL_MAX_TASKS="500").stdout == (
        f"{large}: 1000 tasks; the limit is 500\n"
    )
    size = (ROOT / large).stat().st_size
    assert validate(large, SAAS_EVAL_MAX_FILE_BYTES="100000").stdout == (
        f"{large}: the batch is {size} bytes; the limit is 100000\n"
    )


def test_validate_checks_a_file_for_a_client_folder(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--client` checks the file as dropped into inbox/<client>/ (client_id may go);
    names the inbox never reads are said to be so."""
    cli: Cli = isolated_cli(tmp_path, forge, monkeypatch)
    missing = ROOT / "examples" / "invalid" / "missing-client-id.json"
    minimal = ROOT / "examples" / "valid" / "minimal.json"
    assert cli("validate", "--client", "acme", str(missing), base=False).exit_code == 0
    other = cli("validate", "--client", "beta", str(minimal), base=False)
    assert other.exit_code == 1
    assert other.output == (f"{minimal}: file claims client_id 'acme' but was dropped for 'beta'\n")
    part = tmp_path / "batch.json.part"
    shutil.copy(minimal, part)
    cancel = tmp_path / "cancel-20261201-000000-000abcdef.json"
    cancel.write_text("{}")
    done = cli("validate", str(part), str(cancel), base=False)
    assert done.exit_code == 1
    assert done.output.splitlines() == [
        f"{part}: a temporary upload name: the inbox reads the file once it is renamed to *.json",
        f"{cancel}: cancel files go in the client's folder, "
        "inbox/<client_id>/cancel-<batch_id>.json",
    ]
    ok = cli("validate", "--client", "acme", str(cancel), base=False)
    assert ok.exit_code == 0
    assert "a cancel request for batch 20261201-000000-000abcdef" in ok.output


def test_a_running_service_accepts_each_valid_example_and_files_each_error_as_validate_says(
    tmp_path: Path, forge: SandboxForge
) -> None:
    app, service = build_service(settings_on(forge, tmp_path, quiet_period=0.1, task_price=1))
    app.billing.add_client("acme", 5000)
    # the callback example's host is answered here, never by DNS (loopback only)
    app.intake.policy = CallbackPolicy(resolver=lambda host, port: ["93.184.216.34"])
    inbox = app.settings.inbox_path
    inbox.mkdir(parents=True, exist_ok=True)
    with running(service):
        for path in [*VALID, *INVALID]:
            shutil.copyfile(path, inbox / f".{path.name}.uploading")
            os.rename(inbox / f".{path.name}.uploading", inbox / path.name)
        receipts = {p.stem: inbox / "accepted" / f"{p.name}.receipt.json" for p in VALID}
        errors = {p: inbox / "rejected" / f"{p.name}.error.json" for p in INVALID}
        assert wait_for(lambda: all(r.exists() for r in [*receipts.values(), *errors.values()]))
    for stem, receipt in receipts.items():
        document = read_json(receipt)
        assert (document["ok"], document["status"]) == (True, "in_progress")
        assert document["task_count"] == TASK_COUNTS[stem]
    for path, error_file in errors.items():
        document = read_json(error_file)
        prefix = f"examples/invalid/{path.name}: "
        lines = [line.removeprefix(prefix) for line in expected(path)]
        assert document["message"] == lines[0], path.name
        listed = [f"{e['field']}: {e['reason']}" for e in document.get("errors", [])]
        assert (listed or lines[:1]) == lines, path.name


def test_validate_and_the_inbox_say_the_same_of_a_bad_file_name(app: App, tmp_path: Path) -> None:
    name = "night\x1bly.json"  # an escape character: it would forge a log line
    path = tmp_path / name
    shutil.copy(ROOT / "examples" / "valid" / "minimal.json", path)
    done = validate(name, cwd=tmp_path)
    assert done.returncode == 1
    line = done.stdout.rstrip("\n")
    assert line.startswith(f"{name}: ") and line.endswith("; rename the file and drop it again")
    shutil.copy(path, app.settings.inbox_path / name)
    outcome = app.inbox.process(app.settings.inbox_path / name)
    assert outcome.status == "rejected" and outcome.document["reason"] == "invalid_name"
    assert f"{name}: {outcome.document['message']}" == line


@pytest.mark.parametrize(
    "url",
    [
        "http://127.1:8080/cb",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0177.0.0.1/",
        "http://0/",
        "http://localhost/",
        "http://hooks.localhost./cb",
    ],
)
def test_validate_refuses_every_spelling_of_an_address_the_service_refuses(
    tmp_path: Path, url: str
) -> None:
    document = {"client_id": "acme", "callback_url": url, "tasks": read_json(MINIMAL)["tasks"]}
    (tmp_path / "b.json").write_text(json.dumps(document), encoding="utf-8")
    done = validate(str(tmp_path / "b.json"))
    assert done.returncode == 1 and "refused" in done.stdout, done.stdout
    with pytest.raises(BatchRejected) as refused:  # the service's own check of the same URL
        CallbackPolicy().check(url)
    assert refused.value.reason == "callback_refused"


def test_validate_reads_a_cancel_file_and_knows_the_folders_never_read(tmp_path: Path) -> None:
    cancel = tmp_path / "cancel-20261201-000000-000abcdef.json"
    cancel.write_bytes(b" " * 2048)
    big = validate("--client", "acme", str(cancel), SAAS_EVAL_MAX_FILE_BYTES="1024")
    assert big.returncode == 1 and "1024" in big.stdout, big.stdout  # too large, as the inbox
    for folder in ("accepted", "rejected", ".hidden"):
        unread = validate("--client", folder, str(MINIMAL))
        assert unread.returncode == 1 and "never read" in unread.stdout, unread.stdout
