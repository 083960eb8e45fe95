"""Secrets at rest: a private state folder, 0600 secret files, old installs fixed.

Real folders and the real command line (in-process, `Cli`); what clients read (receipts,
error files, reports) stays readable by them.
"""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import asyncssh
import pytest
from conftest import Cli, isolated_cli, tasks

from dropbox_eval.app import App
from dropbox_eval.delivery.emitter import FileEmitter
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.secrecy import make_state_private


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return isolated_cli(tmp_path, forge, monkeypatch)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def public_key() -> str:
    key = asyncssh.generate_private_key("ssh-ed25519", comment="laptop")
    return key.export_public_key("openssh").decode("ascii")


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_a_fresh_state_folder_is_private_and_what_clients_read_is_not(
    cli: Cli, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    added = cli("clients", "add", "acme", "--credits", "10")
    assert added.exit_code == 0, added.output
    assert mode(state) == 0o700
    index = state / "index.json"
    assert "whsec_" in index.read_text() and mode(index) == 0o600
    keyfile = tmp_path / "laptop.pub"
    keyfile.write_text(public_key())
    assert cli("clients", "add-key", "acme", str(keyfile)).exit_code == 0
    assert mode(state / "sftp") == 0o700 and mode(state / "sftp" / "keys") == 0o700
    assert mode(state / "sftp" / "keys" / "acme.pub") == 0o600
    source = tmp_path / "drop.json"
    source.write_text(json.dumps({"tasks": tasks(1)}))
    assert cli("submit", str(source), "--client", "acme").exit_code == 0
    assert mode(tmp_path / "inbox" / "acme" / "accepted" / "drop.json.receipt.json") == 0o644
    source.write_text("{")
    assert cli("submit", str(source), "--client", "acme").exit_code == 4
    assert mode(tmp_path / "inbox" / "acme" / "rejected" / "drop.json.error.json") == 0o644
    assert mode(state / "rejections.counts.json") == 0o600
    assert mode(state / "rejections.jsonl") == 0o600
    report = FileEmitter(tmp_path / "outbox").write({"batch_id": "b1"})
    assert mode(report) == 0o644


def test_an_old_state_folder_is_made_private_at_start_and_logged_once(
    cli: Cli, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert cli("clients", "add", "acme").exit_code == 0
    keyfile = tmp_path / "laptop.pub"
    keyfile.write_text(public_key())
    assert cli("clients", "add-key", "acme", str(keyfile)).exit_code == 0
    (state / "service.json").write_text("{}")
    outside = tmp_path / "not-state.pub"
    outside.write_text("x")
    outside.chmod(0o644)
    (state / "sftp" / "keys" / "linked.pub").symlink_to(outside)
    secret_files = [state / "index.json", state / "service.json", state / "sftp/keys/acme.pub"]
    for folder in (state, state / "sftp", state / "sftp" / "keys"):
        folder.chmod(0o755)  # as an earlier version left them
    for path in secret_files:
        path.chmod(0o644)
    first = cli("run", "--once")
    assert first.exit_code == 0, first.output
    assert [mode(p) for p in (state, state / "sftp", state / "sftp" / "keys")] == [0o700] * 3
    assert [mode(p) for p in secret_files] == [0o600] * 3
    assert mode(outside) == 0o644  # a link in the state folder is never followed
    lines = [line for line in first.stderr.splitlines() if "made private" in line]
    assert len(lines) == 1, first.stderr
    assert "index.json" in lines[0] and "sftp/keys/acme.pub" in lines[0]
    second = cli("run", "--once")
    assert second.exit_code == 0 and "made private" not in second.stderr


@pytest.mark.tinydb_files
def test_the_fix_only_takes_permissions_away(
    app: App, funded: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = app.settings.state_path
    (state / "index.json").chmod(0o640)
    (state / "service.json").write_text("{}")
    (state / "service.json").chmod(0o400)  # stricter than needed: left as it is
    with caplog.at_level(logging.WARNING, logger="dropbox_eval"):
        assert make_state_private(state) == [state / "index.json"]
        assert make_state_private(state) == []
    assert mode(state / "index.json") == 0o600 and mode(state / "service.json") == 0o400
    assert len([m for m in caplog.messages if "made private" in m]) == 1


def test_the_fix_never_follows_a_link_out_of_the_state_folder(app: App, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keys").mkdir(parents=True)
    foreign = elsewhere / "keys" / "someone.pub"
    foreign.write_text("x")
    foreign.chmod(0o644)
    (app.settings.state_path / "sftp").symlink_to(elsewhere)
    make_state_private(app.settings.state_path)
    assert mode(foreign) == 0o644 and mode(elsewhere) == 0o755
