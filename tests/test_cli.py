"""The operator CLI, invoked in-process through click against the sandbox forge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tasks
from helpers import finish_issues

from dropbox_eval.cli import main
from dropbox_eval.sandbox import SandboxForge


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for key in list(__import__("os").environ):
        if key.startswith("SAAS_EVAL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SAAS_EVAL_SETTLE_SECONDS", "0")  # a closed issue finishes at once
    monkeypatch.setenv("SAAS_EVAL_GITEA_TOKEN", forge.token)  # a secret: never on argv
    runner = CliRunner()
    base = ["--home", str(tmp_path), "--gitea-url", forge.url, "--owner", forge.user]

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(main, [*base, *args], catch_exceptions=False)

    return invoke


def test_clients_add_fund_show_keep_a_ledger(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("clients", "add", "acme", "--credits", "5").exit_code == 0
    assert cli("clients", "fund", "acme", "7").output.strip() == "acme: balance 12"
    assert cli("clients", "fund", "acme", "0").exit_code == 2  # a usage error
    shown = json.loads(cli("clients", "show", "acme", "--json").output)
    assert shown["balance"] == 12
    assert [e["amount"] for e in shown["ledger"]] == [5, 7]
    assert cli("clients", "show", "ghost").exit_code == 3
    assert cli("clients", "add", "acme").exit_code == 1


def test_submit_batches_batch_poll_emit(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    forge: SandboxForge,
) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    source = tmp_path / "elsewhere" / "b.json"
    source.parent.mkdir()
    source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(2)}))
    submitted = cli("submit", str(source), "--json")
    assert submitted.exit_code == 0, submitted.output
    receipt = json.loads(submitted.output)
    batch_id = receipt["batch_id"]
    assert source.exists()  # the original stays where it was; a copy went through the inbox
    assert (tmp_path / "inbox" / "accepted" / "b.json").read_bytes() == source.read_bytes()
    listed = json.loads(cli("batches", "--json").output)
    assert [(r["batch_id"], r["status"], r["total"]) for r in listed] == [(batch_id, "running", 2)]
    assert "running" in cli("batches").output
    assert cli("emit", batch_id).exit_code == 1
    finish_issues(
        forge, json.loads(cli("batch", batch_id, "--json").output)["repo"], comment="Fine."
    )
    polled = json.loads(cli("poll", "--json").output)
    assert sorted(polled[batch_id]) == ["t1", "t2"]
    detail = json.loads(cli("batch", batch_id, "--json").output)
    assert detail["status"] == "completed"
    assert [t["status"] for t in detail["tasks"]] == ["passed", "passed"]
    assert "Fine." in cli("batch", batch_id).output
    assert cli("emit", batch_id).exit_code == 0
    report = json.loads((tmp_path / "outbox" / f"{batch_id}.json").read_text())
    assert report["counts"]["passed"] == 2
    assert "already emitted" in cli("emit", batch_id).output
    assert cli("batch", "nope").exit_code == 3


def test_submit_rejected_file_exits_4(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("clients", "add", "acme").exit_code == 0  # submit needs a state
    source = tmp_path / "bad.json"
    source.write_text("{not json")
    result = cli("submit", str(source), "--client", "acme")
    assert result.exit_code == 4
    assert "invalid_json" in result.output
    assert (tmp_path / "inbox" / "acme" / "rejected" / "bad.json.error.json").exists()


def test_status_reports_not_running(cli) -> None:  # type: ignore[no-untyped-def]
    cli("clients", "add", "acme")
    result = cli("status", "--json")
    assert result.exit_code == 3  # as `systemctl status` of a stopped unit
    assert json.loads(result.output)["running"] is False


def test_watch_follows_until_the_batch_ends(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    forge: SandboxForge,
) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    source = tmp_path / "w.json"
    source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(2)}))
    batch_id = json.loads(cli("submit", str(source), "--json").output)["batch_id"]
    listing = cli("batches").output
    assert "----------" in listing  # an empty progress bar
    assert batch_id in listing  # whole, even when not printed to a terminal
    finish_issues(forge, json.loads(cli("batch", batch_id, "--json").output)["repo"])
    cli("run", "--once")
    assert "##########" in cli("batches").output  # a full one
    watched = cli("watch", batch_id, "--interval", "0.1")
    assert watched.exit_code == 0
    assert f"{batch_id}: emitted, 2/2 done" in watched.output
    counts = json.loads(cli("batch", batch_id, "--json").output)["counts"]
    assert counts["passed"] == 2 and counts["open"] == 0 and counts["total"] == 2


def test_client_ids_must_be_usable_as_folder_names(cli) -> None:  # type: ignore[no-untyped-def]
    for bad in ("Acme Corp", "../x", ".hidden"):
        result = cli("clients", "add", bad)
        assert result.exit_code == 2 and "must match" in result.output
