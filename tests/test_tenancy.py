"""Tenant boundaries: client ids that name the inbox's own folders are refused.

Real folders, the real command line (in-process, `Cli`), the real inbox and service. The
HTTP API and SFTP sides are in test_api.py and test_sftp.py; secrets at rest in
test_secrets_at_rest.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import asyncssh
import pytest
from conftest import Cli, isolated_cli, read_json, tasks

from dropbox_eval.app import App, service_for
from dropbox_eval.errors import InvalidArgument
from dropbox_eval.inbox import candidates
from dropbox_eval.models import Client, utcnow
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sftp.keys import KeyStore
from dropbox_eval.util.names import RESERVED_CLIENT_IDS, reserved_reason


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return isolated_cli(tmp_path, forge, monkeypatch)


def public_key() -> str:
    key = asyncssh.generate_private_key("ssh-ed25519", comment="laptop")
    return key.export_public_key("openssh").decode("ascii")


def legacy_client(app: App, client_id: str, credits: int = 50) -> None:
    """A client stored by a version that did not reserve its id (billing refuses it now)."""
    with app.store.transaction() as tx:
        tx.add_client(Client(client_id=client_id, created_at=utcnow()))
    app.billing.fund(client_id, credits)


# -- reserved client ids ----------------------------------------------------------------------


def test_the_reserved_names_cover_every_folder_of_the_inbox_outbox_and_sftp_view() -> None:
    assert {"accepted", "rejected", "undelivered", "reports"} <= RESERVED_CLIENT_IDS
    for name in ("ACCEPTED", "Rejected", "x.json", "y.JSON", "z.part", "w.filepart"):
        assert reserved_reason(name) is not None, name
    for name in ("acme", "accepted-team", "reports2", "json", "my.part.1"):
        assert reserved_reason(name) is None, name


@pytest.mark.parametrize(
    "client_id", ["accepted", "Rejected", "undelivered", "reports", "REPORTS", "b.json"]
)
def test_clients_add_refuses_a_reserved_id(cli: Cli, client_id: str) -> None:
    result = cli("clients", "add", client_id, "--credits", "5")
    assert result.exit_code == 2, result.output
    assert f"client id {client_id!r} is reserved" in result.output
    assert "choose another id" in result.output
    listed = cli("clients", "list", "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []


def test_clients_add_still_takes_ids_that_only_contain_a_reserved_word(cli: Cli) -> None:
    result = cli("clients", "add", "accepted-team", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["client_id"] == "accepted-team"


def test_submit_refuses_a_reserved_or_invalid_client_folder(cli: Cli, tmp_path: Path) -> None:
    source = tmp_path / "drop.json"
    source.write_text(json.dumps({"tasks": tasks(1)}))
    refused = cli("submit", str(source), "--client", "Accepted")
    assert refused.exit_code == 2 and "'Accepted' is reserved" in refused.output
    outside = cli("submit", str(source), "--client", "../escape")
    assert outside.exit_code == 2 and "must match" in outside.output
    assert not (tmp_path / "inbox" / "Accepted").exists()
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("claimed", ["accepted", "Undelivered"])
def test_a_drop_naming_a_reserved_client_id_is_rejected_with_an_error_file(
    app: App, claimed: str
) -> None:
    legacy_client(app, claimed)  # even an account stored before gets nothing
    drop = app.inbox.root / "claim.json"
    drop.write_text(json.dumps({"client_id": claimed, "tasks": tasks(1)}))
    outcome = app.inbox.process(drop)
    assert outcome.status == "rejected"
    error = read_json(app.inbox.root / "rejected" / "claim.json.error.json")
    assert error["reason"] == "reserved_client_id" and error["field"] == "client_id"
    assert f"client id {claimed!r} is reserved" in error["message"]
    assert (app.inbox.root / "rejected" / "claim.json").exists()
    assert not (app.inbox.root / "accepted").exists()
    assert app.store.count_batches() == {}


def test_a_file_in_a_client_folder_claiming_a_reserved_id_is_rejected_there(
    app: App, funded: str
) -> None:
    drop = app.inbox.root / funded / "claim.json"
    drop.parent.mkdir(parents=True)
    drop.write_text(json.dumps({"client_id": "Rejected", "tasks": tasks(1)}))
    assert app.inbox.process(drop).status == "rejected"
    error = read_json(app.inbox.root / funded / "rejected" / "claim.json.error.json")
    assert error["reason"] == "reserved_client_id"


def test_files_in_a_reserved_folder_are_never_a_clients_drop(app: App) -> None:
    for legacy in ("reports", "Undelivered"):
        legacy_client(app, legacy)  # funded: without the rule its drops would be taken
    root = app.inbox.root
    planted = [
        root / "reports" / "x.json",
        root / "Undelivered" / "y.json",
        root / "b.json" / "z.json",
    ]
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"tasks": tasks(1)}))
    assert candidates(root) == []
    assert all(app.inbox.process(path).status == "skipped" for path in planted)
    service_for(app).run(once=True)
    assert all(path.exists() for path in planted)
    assert not any((path.parent / "accepted").exists() for path in planted)
    assert app.store.count_batches() == {}


def test_a_client_stored_before_its_id_was_reserved_is_named_at_start_and_in_status(
    app: App,
    tmp_path: Path,
    forge: SandboxForge,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    legacy_client(app, "accepted", credits=30)
    with caplog.at_level(logging.WARNING, logger="dropbox_eval"):
        service_for(app).run(once=True)
    named = [m for m in caplog.messages if "client 'accepted' has a reserved id" in m]
    assert len(named) == 1, caplog.messages
    assert "create a new client" in named[0] and "--credits 30" in named[0]
    cli = isolated_cli(tmp_path, forge, monkeypatch)
    status = cli("status")
    assert status.exit_code == 3  # the service is not running: 3, as `systemctl status` says
    assert "warning: client 'accepted' has a reserved id" in status.stdout
    as_json = json.loads(cli("status", "--json").stdout)
    assert as_json["reserved_clients"] == [{"client_id": "accepted", "available": 30}]
    refused = cli("clients", "api-key", "accepted")
    assert refused.exit_code == 2 and "it gets no API key" in refused.output
    with (
        KeyStore(app.settings.state_path, app.settings.database_url) as keys,
        pytest.raises(InvalidArgument, match="cannot log in over SFTP"),
    ):
        keys.add("accepted", public_key())
