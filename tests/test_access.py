"""Who may come in (issue 32): API keys with ids, listed and revoked at once over the real
HTTP server; a disabled client refused at the folder, the API and the SFTP endpoint (the
real OpenSSH client), its running batch still finished and delivered; removal only once
settled; and every operator action in the audit log."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import PATIENCE, Cli, isolated_cli, read_json, served, settings_on, tasks, wait_for
from helpers import drop, finish_issues, receipt_of
from sftp_stack import Stack, close, paramiko_client, running_stack, sftp

from dropbox_eval.app import App, build_app
from dropbox_eval.billing.accounts import hash_api_key
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.audit import local_user

OPERATOR_KEY = "access-operator-key"


def as_json(cli: Cli, *args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def call(url: str, key: str, method: str = "GET", path: str = "", **kwargs: Any) -> Any:
    return requests.request(
        method,
        f"{url}/api/eval/batches{path}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=PATIENCE,
        **kwargs,
    )


def actions(cli: Cli) -> list[tuple[str, str, str]]:
    """(action, target, result) of every audit entry, oldest first."""
    return [(e["action"], e["target"], e["result"]) for e in as_json(cli, "audit", "--all")]


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return isolated_cli(tmp_path, forge, monkeypatch)


def test_a_revoked_key_answers_401_at_once_while_the_other_key_works(app: App, cli: Cli) -> None:
    as_json(cli, "clients", "add", "acme", "--credits", "10")
    first = as_json(cli, "clients", "api-key", "acme")
    second = as_json(cli, "clients", "api-key", "acme")
    assert first["key_id"].startswith("ak_") and first["key"].startswith("dek_acme_")
    assert first["key_id"] != second["key_id"]
    # a key stored before keys had ids (a bare hash) gets an id, works and is revoked alike
    with app.store.transaction() as tx:
        tx.update_client("acme", api_key_hashes=[hash_api_key("dek_acme_old")])
    with served(app) as url:
        for key in (first["key"], second["key"], "dek_acme_old"):
            assert call(url, key).status_code == 200
        listed = cli("clients", "keys", "acme", "--json")
        assert first["key"] not in listed.stdout and hash_api_key(first["key"]) not in listed.stdout
        rows = {row["key_id"]: row for row in json.loads(listed.stdout)}
        old_id = f"ak_{hash_api_key('dek_acme_old')[:12]}"
        assert set(rows) == {first["key_id"], second["key_id"], old_id}
        assert rows[first["key_id"]]["created_at"].endswith("Z")
        assert rows[first["key_id"]]["last_used_at"].endswith("Z")
        assert rows[old_id]["created_at"] is None  # not known for an old key

        revoked = cli("clients", "revoke-key", "acme", first["key_id"])
        assert revoked.exit_code == 0, revoked.output
        # the running server reads the keys as they are now: no restart
        gone = call(url, first["key"])
        assert gone.status_code == 401 and gone.json()["reason"] == "unauthorized"
        assert call(url, second["key"]).status_code == 200
        assert cli("clients", "revoke-key", "acme", old_id).exit_code == 0
        assert call(url, "dek_acme_old").status_code == 401
        assert call(url, second["key"]).status_code == 200
    assert [r["key_id"] for r in as_json(cli, "clients", "keys", "acme")] == [second["key_id"]]
    assert cli("clients", "revoke-key", "acme", first["key_id"]).exit_code == 3
    assert actions(cli)[-5:] == [
        ("clients api-key", "acme", "ok"),
        ("clients api-key", "acme", "ok"),
        ("clients revoke-key", "acme", "ok"),
        ("clients revoke-key", "acme", "ok"),
        ("clients revoke-key", "acme", "not_found"),
    ]


def test_removal_waits_for_a_settled_account_and_keeps_the_ledger(app: App, cli: Cli) -> None:
    as_json(cli, "clients", "add", "acme", "--credits", "5")
    key = as_json(cli, "clients", "api-key", "acme")["key"]
    batch_id = cli.submit(1)
    busy = json.loads(cli("clients", "remove", "acme", "--json").stdout)
    assert busy["reason"] == "not_settled" and busy["batches"] == [batch_id]
    assert as_json(cli, "cancel", batch_id)["status"] == "cancelled"
    assert cli("emit", batch_id).exit_code == 0
    credits = json.loads(cli("clients", "remove", "acme", "--json").stdout)
    assert credits["reason"] == "not_settled" and credits["balance"] == 5
    removed = as_json(cli, "clients", "remove", "acme", "--write-off")
    assert removed["state"] == "removed" and removed["written_off"] == 5
    shown = as_json(cli, "clients", "show", "acme")
    assert shown["balance"] == 0 and shown["ledger"][-1]["kind"] == "write_off"
    assert sum(e["amount"] for e in shown["ledger"]) == 0  # the ledger still sums
    assert cli("check").exit_code == 0
    assert cli("clients", "fund", "acme", "1").exit_code == 3  # removed: no more changes
    assert "was removed" in cli("clients", "add", "acme").output  # its id is not reused
    refused = drop(app.settings.inbox_path, "late.json", {"tasks": tasks(1)}, "acme")
    assert cli("run", "--once").exit_code == 0
    error = read_json(refused.parent / "rejected" / "late.json.error.json")
    assert error["reason"] == "unknown_client"
    with served(app) as url:
        assert call(url, key).status_code == 401
    assert [a for a in actions(cli) if a[0] == "clients remove"] == [
        ("clients remove", "acme", "not_settled"),
        ("clients remove", "acme", "not_settled"),
        ("clients remove", "acme", "ok"),
    ]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """The service, the SFTP endpoint (a `dropbox-eval sftp` process) and `acme` with a key."""
    settings = {"poll_interval": 0.2, "quiet_period": 0.1, "settle_seconds": 0}
    with running_stack(tmp_path, ("acme",), **settings) as up:
        up.app.billing.fund("acme", 100)
        yield up


def test_a_disabled_client_is_refused_at_every_door_and_enabled_works_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, inbox = stack.app, stack.app.settings.inbox_path
    cli = isolated_cli(stack.home, stack.forge, monkeypatch)
    key = as_json(cli, "clients", "api-key", "acme")["key"]
    with served(app) as url:
        running = call(url, key, "POST", json={"tasks": tasks(2)})
        assert running.status_code == 201, running.text
        batch_id = running.json()["batch_id"]
        assert sftp(stack, "ls\n").returncode == 0

        assert as_json(cli, "clients", "disable", "acme")["state"] == "disabled"
        dropped = drop(inbox, "new.json", {"tasks": tasks(1)}, "acme")
        error_file = dropped.parent / "rejected" / "new.json.error.json"
        assert wait_for(error_file.exists)
        assert read_json(error_file)["reason"] == "client_disabled"
        for method, path in (("GET", ""), ("POST", ""), ("GET", f"/{batch_id}")):
            refused = call(url, key, method, path, json={"tasks": tasks(1)})
            assert refused.status_code == 403, refused.text
            assert refused.json()["reason"] == "client_disabled"
        login = sftp(stack, "ls\n")
        assert login.returncode == 255 and "client_disabled" in login.stderr
        # what was taken runs to its end and is delivered
        finish_issues(stack.forge, app.store.get_batch(batch_id).repo)
        assert wait_for(lambda: (app.settings.outbox_path / f"{batch_id}.json").exists())

        assert as_json(cli, "clients", "enable", "acme")["state"] == "active"
        again = drop(inbox, "again.json", {"tasks": tasks(1)}, "acme")
        assert wait_for(receipt_of(again).exists)
        assert call(url, key).status_code == 200
        assert sftp(stack, "ls\n").returncode == 0
    listed = as_json(cli, "clients", "keys", "acme")
    sftp_key = next(row for row in listed if row["kind"] == "sftp")
    assert sftp_key["key_id"].startswith("SHA256:") and sftp_key["last_used_at"].endswith("Z")
    assert cli("clients", "revoke-key", "acme", sftp_key["key_id"]).exit_code == 0
    assert sftp(stack, "ls\n").returncode == 255
    entries = as_json(cli, "audit", "--limit", "4")
    assert [(e["action"], e["result"]) for e in entries] == [
        ("clients api-key", "ok"),
        ("clients disable", "ok"),
        ("clients enable", "ok"),
        ("clients revoke-key", "ok"),
    ]
    assert {e["actor"] for e in entries} == {local_user()} and {e["via"] for e in entries} == {
        "cli"
    }
    assert all(e["at"].endswith("Z") and len(e["at"]) == 20 for e in entries)


def test_the_page_and_the_operator_api_are_in_the_audit_log(
    tmp_path: Path, forge: SandboxForge, cli: Cli
) -> None:
    app = build_app(settings_on(forge, tmp_path, operator_key=OPERATOR_KEY), create=True)
    app.billing.add_client("acme", 10)
    batch_id = cli.submit(1)
    with served(app) as url:
        page = requests.Session()
        signed = page.post(
            f"{url}/operator/login", data={"key": OPERATOR_KEY, "name": "Ada\u202e"}, timeout=30
        )
        assert signed.status_code == 200
        csrf = signed.text.split('name="csrf" value="')[1].split('"')[0]
        form = {"csrf": csrf, "confirm": "yes"}
        page.post(f"{url}/operator/batches/{batch_id}/cancel", data=form, timeout=30)
        page.post(f"{url}/operator/batches/{batch_id}/retry", data=form, timeout=30)
        page.post(f"{url}/operator/batches/{batch_id}/deliver", data=form, timeout=30)
        operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        assert requests.post(f"{url}/api/eval/pause", headers=operator, timeout=30).ok
        assert requests.post(f"{url}/api/eval/resume", headers=operator, timeout=30).ok
    entries = as_json(cli, "audit")
    assert [(e["via"], e["actor"], e["action"], e["target"], e["result"]) for e in entries] == [
        ("page", "Ada", "cancel", batch_id, "ok"),
        ("page", "Ada", "retry", batch_id, "not_retryable"),
        ("page", "Ada", "emit", batch_id, "ok"),
        ("api", "operator", "pause", "-", "ok"),
        ("api", "operator", "resume", "-", "ok"),
    ]
    assert len({e["key_id"] for e in entries}) == 1 and OPERATOR_KEY not in json.dumps(entries)
    audit_file = tmp_path / "state" / "audit.jsonl"
    assert stat.S_IMODE(audit_file.stat().st_mode) == 0o600
    assert len(audit_file.read_text().splitlines()) == 5
    shown = cli("audit")
    assert shown.exit_code == 0 and "not_retryable" in shown.output


def test_a_clients_junk_ids_reach_neither_the_audit_log_nor_the_operators_terminal(
    app: App, cli: Cli
) -> None:
    app.billing.add_client("acme", 10)
    key = app.billing.new_api_key("acme")
    with served(app) as url:
        for junk in ("%1b%5b2J%1b%5d0%3bpwned%07", "x%0a{}", ".."):
            refused = call(url, key, "DELETE", f"/{junk}")
            assert refused.status_code == 404 and refused.json()["reason"] == "not_found"
        assert call(url, key, "DELETE", "/20990101-000000-000000000").status_code == 404
    # a batch-shaped id is recorded (someone tried it); junk is refused before the log
    assert [e[1] for e in actions(cli)] == ["20990101-000000-000000000"]
    app.store.record_action("delete", "\x1b[2J\x1b]0;pwned", actor="a\nb", via="api")
    shown = cli("audit")
    assert shown.exit_code == 0 and "\x1b" not in shown.output and "\\x1b[2J" in shown.output
    assert "a\\nb" in shown.output


def test_a_session_open_when_its_key_is_revoked_or_its_client_disabled_uploads_no_more(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leaked key's session does not outlive the revocation: each upload's start asks
    again whether the session's key is listed and its client may send work."""
    cli = isolated_cli(stack.home, stack.forge, monkeypatch)
    body = json.dumps({"tasks": tasks(1)}).encode()
    sftp_key = next(r for r in as_json(cli, "clients", "keys", "acme") if r["kind"] == "sftp")
    cut_offs = (
        (("clients", "disable", "acme"), "client_disabled", ("clients", "enable", "acme")),
        (("clients", "revoke-key", "acme", sftp_key["key_id"]), "revoked", None),
    )
    for cut_off, reason, undo in cut_offs:
        session = paramiko_client(stack)
        try:
            with session.open(f"before-{reason}.json", "wb") as upload:
                upload.write(body)
            assert cli(*cut_off).exit_code == 0
            with pytest.raises(PermissionError, match=reason):
                session.open(f"after-{reason}.json", "wb")
        finally:
            close(session)
        assert not (stack.folder("acme") / f"after-{reason}.json").exists()
        if undo:
            assert cli(*undo).exit_code == 0
