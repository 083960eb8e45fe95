"""A batch's whole life (issue 32): its client's `metadata` from the drop to the report,
the API list's filters and cursor, delete and its tombstone, the retention prune (money
never pruned), and rejected drops counted against the SFTP quota. Real parts: the sandbox
forge over loopback HTTP, the inbox on real files, TinyDB in a tmp folder."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from asyncssh import SFTPQuotaExceeded
from conftest import OPERATOR_KEY, SCHEMAS, isolated_cli, read_json, tasks, wait_for
from helpers import drop, finish_issues, fixed_report, receipt_of

from dropbox_eval.app import App
from dropbox_eval.errors import BatchRejected
from dropbox_eval.ops.retention import Retention
from dropbox_eval.protocol.batchfile import parse_batch
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sftp.bounds import Bounds
from dropbox_eval.util.alarm import Alarm
from dropbox_eval.views import Views
from dropbox_eval.workers.retention import PruneSchedule, service_retention

METADATA = {"run": "nightly-42", "commit": "9f1c2e7"}


def _drop(app: App, name: str, **fields: Any) -> dict[str, Any]:
    """Drop a batch of acme's with `fields` and let the inbox take it; its receipt."""
    document = {"batch_ref": name.removesuffix(".json"), "tasks": tasks(2), **fields}
    dropped = drop(app.settings.inbox_path, name, document, "acme")
    app.inbox.process(dropped)
    receipt: dict[str, Any] = read_json(receipt_of(dropped))
    return receipt


def _finish(app: App, forge: SandboxForge, batch_id: str) -> None:
    """The lane finishes the batch's issues; a poll ends it (status `completed`)."""
    app.intake.open_issues(batch_id)
    finish_issues(forge, app.store.get_batch(batch_id).repo)
    app.poller.poll_completed(batch_id, full=True)
    assert app.store.get_batch(batch_id).status == "completed"


def _money(app: App) -> tuple[int, int, int, int]:
    client = app.store.get_client("acme")
    assert client is not None
    return client.balance, client.held, client.available, len(app.store.ledger("acme"))


def _call(url: str, key: str, method: str, path: str = "", **kwargs: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return requests.request(
        method, f"{url}/api/eval/batches{path}", timeout=30, headers=headers, **kwargs
    )


# -- metadata ----------------------------------------------------------------------------


def test_metadata_goes_from_the_drop_to_the_receipt_every_view_and_the_report(
    app: App, funded: str, forge: SandboxForge, operator_web: tuple[str, Any]
) -> None:
    receipt = _drop(app, "labelled.json", metadata=METADATA)
    batch_id = receipt["batch_id"]
    assert receipt["metadata"] == METADATA
    assert "metadata" not in _drop(app, "plain.json")  # none given: none said
    assert Views(app.store).batch(batch_id)["metadata"] == METADATA
    _finish(app, forge, batch_id)
    report = fixed_report(app.store, batch_id)
    assert report is not None and report["metadata"] == METADATA
    key = app.billing.new_api_key("acme")
    url, _ = operator_web
    assert _call(url, key, "GET", f"/{batch_id}").json()["metadata"] == METADATA
    assert json.loads(_call(url, key, "GET", f"/{batch_id}/report").text)["metadata"] == METADATA
    page = requests.Session()
    page.post(f"{url}/operator/login", data={"key": OPERATOR_KEY}, timeout=30)
    shown = page.get(f"{url}/operator/batches/{batch_id}", timeout=30).text
    assert 'id="metadata"' in shown and "nightly-42" in shown


@pytest.mark.parametrize(
    ("metadata", "field", "reason"),
    [
        ({f"k{n}": "v" for n in range(17)}, "metadata", "should have at most 16 keys, not 17"),
        ({"k" * 65: "v"}, f"metadata.{'k' * 65}.[key]", "at most 64 characters, not 65"),
        ({"run": "v" * 513}, "metadata.run", "at most 512 characters, not 513"),
        ({"run": 42}, "metadata.run", "valid string"),
        ({"": "v"}, "metadata..[key]", "at least 1 character"),
        (["run"], "metadata", "valid dictionary"),
    ],
)
def test_metadata_past_its_limits_is_refused_by_the_parser_and_the_schema(
    metadata: Any, field: str, reason: str
) -> None:
    document = {"client_id": "acme", "tasks": tasks(1), "metadata": metadata}
    with pytest.raises(BatchRejected) as refused:
        parse_batch(json.dumps(document).encode(), max_bytes=1 << 20, max_tasks=10)
    assert refused.value.reason == "invalid_batch"
    assert refused.value.details["field"] == field and reason in refused.value.message
    assert not SCHEMAS["batch"].is_valid(document)
    largest = {f"k{n:02d}" + "k" * 61: "v" * 512 for n in range(16)}
    document["metadata"] = largest  # the limits themselves are fine
    assert parse_batch(json.dumps(document).encode(), max_bytes=1 << 20, max_tasks=10).metadata
    assert SCHEMAS["batch"].is_valid(document)


# -- the API list -------------------------------------------------------------------------


def test_the_list_filters_by_status_and_client_and_pages_by_a_cursor(
    app: App, funded: str, forge: SandboxForge, operator_web: tuple[str, Any]
) -> None:
    url, _ = operator_web
    app.billing.add_client("beta", 100)
    key, beta = app.billing.new_api_key("acme"), app.billing.new_api_key("beta")
    ids = [
        _call(url, key, "POST", json={"batch_ref": f"r{n}", "tasks": tasks(1)}).json()["batch_id"]
        for n in range(3)
    ]
    assert len(set(ids)) == 3
    other = _call(url, beta, "POST", json={"tasks": tasks(1)}).json()["batch_id"]
    app.lifecycle.cancel(ids[0])
    failed = _call(url, key, "GET", params={"status": "cancelled"})
    assert [b["batch_id"] for b in failed.json()] == [ids[0]]
    assert failed.headers["X-Total-Count"] == "1"
    assert _call(url, key, "GET", params={"status": "failed"}).json() == []
    assert _call(url, key, "GET", params={"status": "bogus"}).status_code == 422
    first = _call(url, key, "GET", params={"limit": 2})
    assert [b["batch_id"] for b in first.json()] == [ids[2], ids[1]]
    assert first.headers["X-Next-After"] == ids[1] and 'rel="next"' in first.headers["Link"]
    rest = _call(url, key, "GET", params={"limit": 2, "after": ids[1]})
    assert [b["batch_id"] for b in rest.json()] == [ids[0]] and "X-Next-After" not in rest.headers
    both = _call(url, key, "GET", params={"after": ids[1], "page": 2})
    assert both.status_code == 422
    assert _call(url, key, "GET", params={"client": "beta"}).status_code == 403
    assert [b["batch_id"] for b in _call(url, key, "GET", params={"client": "acme"}).json()] == (
        ids[::-1]
    )
    everyone = _call(url, OPERATOR_KEY, "GET").json()
    assert {b["batch_id"] for b in everyone} == {*ids, other}
    assert "source" in everyone[0]  # the operator's view keeps the operator's fields
    theirs = _call(url, OPERATOR_KEY, "GET", params={"client": "beta"}).json()
    assert [b["batch_id"] for b in theirs] == [other]
    assert _call(url, "wrong-key", "GET").status_code == 401


def test_a_cursor_of_another_clients_or_a_deleted_batch_is_refused_not_an_empty_page(
    app: App, funded: str, forge: SandboxForge, operator_web: tuple[str, Any]
) -> None:
    url, _ = operator_web
    app.billing.add_client("beta", 100)
    key, beta = app.billing.new_api_key("acme"), app.billing.new_api_key("beta")
    theirs = _call(url, beta, "POST", json={"tasks": tasks(1)}).json()["batch_id"]
    ours = [_drop(app, f"c{n}.json")["batch_id"] for n in range(3)]
    stranger = _call(url, key, "GET", params={"after": theirs})  # no hint it exists
    assert stranger.status_code == 422 and stranger.json() == _call(
        url, key, "GET", params={"after": "20990101-000000-000000000"}
    ).json() | {"message": f"`after`: no batch {theirs!r} in this list"}
    first = _call(url, key, "GET", params={"limit": 1})
    cursor = first.headers["X-Next-After"]
    assert cursor == ours[2]
    _finish(app, forge, cursor)
    app.delivery.emit(cursor)
    assert _call(url, key, "DELETE", f"/{cursor}").status_code == 200
    gone = _call(url, key, "GET", params={"limit": 1, "after": cursor})
    assert gone.status_code == 422 and "was deleted" in gone.json()["message"]
    again = _call(url, key, "GET", params={"limit": 5})  # from the first page: the rest
    assert again.status_code == 200, again.text
    assert [b["batch_id"] for b in again.json()] == [ours[1], ours[0]]
    assert _call(url, OPERATOR_KEY, "GET", params={"after": theirs}).status_code == 200


# -- delete -------------------------------------------------------------------------------


def test_delete_keeps_a_tombstone_and_the_money_and_its_report_answers_404(
    app: App, funded: str, forge: SandboxForge, operator_web: tuple[str, Any]
) -> None:
    url, _ = operator_web
    key = app.billing.new_api_key("acme")
    receipt = _drop(app, "gone.json", metadata=METADATA)
    batch_id = receipt["batch_id"]
    running = _call(url, key, "DELETE", f"/{batch_id}")
    assert running.status_code == 409 and running.json()["reason"] == "not_finished"
    _finish(app, forge, batch_id)
    app.delivery.emit(batch_id)
    outbox = app.settings.outbox_path / f"{batch_id}.json"
    dropped = app.settings.inbox_path / "acme" / "accepted" / "gone.json"
    assert outbox.exists() and dropped.exists()
    original = dropped.read_bytes()
    money = _money(app)
    app.billing.add_client("beta", 10)
    stranger = _call(url, app.billing.new_api_key("beta"), "DELETE", f"/{batch_id}")
    assert stranger.status_code == 404  # another client's batch does not exist for it
    deleted = _call(url, key, "DELETE", f"/{batch_id}")
    assert deleted.status_code == 200, deleted.text
    tombstone = deleted.json()
    assert tombstone["deleted"] is True and tombstone["client_id"] == "acme"
    assert tombstone["counts"] == {"total": 2, "passed": 2, "failed": 0}
    assert tombstone["charged"] == 4 and tombstone["created_at"].endswith("Z")
    assert "metadata" not in tombstone  # the client's data goes with the batch
    assert _call(url, key, "GET", f"/{batch_id}/report").status_code == 404
    assert _call(url, key, "GET", f"/{batch_id}").json() == tombstone
    assert _call(url, key, "DELETE", f"/{batch_id}").json() == tombstone  # again: the same
    assert not outbox.exists() and not dropped.exists() and not receipt_of(dropped).exists()
    assert _money(app) == money  # balance, held, available and every ledger entry
    assert app.store.is_recorded(batch_id)  # a retry link to it never looks pending
    again = drop(app.settings.inbox_path, "gone.json", original, "acme")
    app.inbox.process(again)  # the same bytes and batch_ref again: a new batch
    renewed = read_json(receipt_of(again))
    assert renewed["batch_id"] != batch_id and not renewed.get("duplicate")


def test_delete_of_an_ended_batch_still_in_the_index_settles_and_archives_it(
    app: App, funded: str, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = _drop(app, "undelivered.json")["batch_id"]
    app.lifecycle.cancel(batch_id)  # ended, its report not delivered: still live
    assert app.store.list_batches(live_only=True, batch_id=batch_id)
    money = _money(app)
    cli = isolated_cli(app.settings.home, forge, monkeypatch)
    deleted = cli("delete", batch_id, "--json")
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.stdout)["status"] == "cancelled"
    assert not app.store.list_batches(live_only=True, batch_id=batch_id)
    assert _money(app) == money
    assert cli("delete", "no-such-batch").exit_code == 3
    entries = app.store.audit_entries()
    assert any(entry.action == "delete" and entry.target == batch_id for entry in entries)


# -- retention ----------------------------------------------------------------------------


def test_prune_deletes_what_ended_keeps_what_runs_and_never_moves_money(
    app: App, funded: str, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = _drop(app, "old.json")["batch_id"]
    _finish(app, forge, ended)
    app.delivery.emit(ended)
    cancelled = _drop(app, "cancelled.json")["batch_id"]
    app.lifecycle.cancel(cancelled)
    running = _drop(app, "running.json")["batch_id"]
    bad = drop(app.settings.inbox_path, "bad.json", b"{not json", "acme")
    app.inbox.process(bad)
    rejected = app.settings.inbox_path / "acme" / "rejected"
    assert sorted(p.name for p in rejected.iterdir()) == ["bad.json", "bad.json.error.json"]
    money = _money(app)
    cli = isolated_cli(app.settings.home, forge, monkeypatch)
    off = cli("prune", "--json")
    assert off.exit_code == 2 and "SAAS_EVAL_RETENTION_DAYS" in off.stdout  # off by default
    kept = cli("prune", "--older-than", "1", "--json")  # nothing is a day old
    assert json.loads(kept.stdout)["batches"] == [] and json.loads(kept.stdout)["files"] == 0
    dry = json.loads(cli("prune", "--older-than", "0", "--dry-run", "--json").stdout)
    assert sorted(dry["batches"]) == sorted([ended, cancelled]) and dry["files"] == 2
    assert app.store.tombstone(ended) is None and rejected.joinpath("bad.json").exists()
    pruned = cli("prune", "--older-than", "0", "--json")
    assert pruned.exit_code == 0, pruned.output
    assert sorted(json.loads(pruned.stdout)["batches"]) == sorted([ended, cancelled])
    assert list(rejected.iterdir()) == []
    for batch_id in (ended, cancelled):
        assert app.store.tombstone(batch_id) is not None
        assert cli("batch", batch_id).exit_code == 3
    assert app.store.get_batch(running).status == "running"  # a running batch stays
    assert _money(app) == money  # balance, held, available and every ledger entry
    assert json.loads(cli("prune", "--older-than", "0", "--json").stdout)["batches"] == []


def test_the_service_prunes_on_its_own_schedule_when_retention_is_set(
    app: App, funded: str, forge: SandboxForge
) -> None:
    batch_id = _drop(app, "cancel-then-prune.json")["batch_id"]
    app.lifecycle.cancel(batch_id)
    assert Retention(app.store, app.billing, app.settings).cutoff() is None  # 0: off
    app.settings.retention_days = 1
    retention = service_retention(app.store, app.billing, app.settings)
    assert retention.prune().batches == []  # ended just now: within the day kept
    alarm, stop = Alarm("test-retention"), threading.Event()
    errors: list[Exception] = []
    try:  # the schedule the service starts, with an age every batch has
        schedule = PruneSchedule(
            lambda: retention.prune(0), alarm, stop, lambda _what, exc: errors.append(exc), first=0
        )
        schedule.start()
        assert wait_for(lambda: schedule.runs == 1)
    finally:
        stop.set()
        alarm.stop()
    assert errors == [] and app.store.tombstone(batch_id) is not None
    audit = app.store.audit_entries()
    assert any(entry.actor == "service" and entry.action == "prune" for entry in audit)


# -- the quota -----------------------------------------------------------------------------


def test_rejected_drops_count_against_the_quota_until_removed(tmp_path: Path) -> None:
    """20 x 190 kB `.json` files filed into rejected/ fill a 1 MB quota."""
    folder = tmp_path / "acme"
    (folder / "rejected").mkdir(parents=True)
    for n in range(20):
        (folder / "rejected" / f"r{n}.json").write_bytes(b"x" * 190_000)
        (folder / "rejected" / f"r{n}.json.error.json").write_bytes(b"{}")
    session = Bounds(16, 32, 1_000_000).session("acme")
    root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SFTPQuotaExceeded, match="rejected/"):
            session.start_upload(root, ".sftp-1.next.json.part")
        session.end_upload(".sftp-1.next.json.part", kept=False)
        for path in (folder / "rejected").iterdir():  # pruned (or removed by the client)
            path.unlink()
        session.start_upload(root, ".sftp-2.next.json.part")
        session.grow(".sftp-2.next.json.part", 190_000)  # room again
    finally:
        os.close(root)
