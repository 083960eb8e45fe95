"""TinyDB state: atomic files, inter-process lock, loud failure on corruption."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import tasks
from helpers import finish_issues

from dropbox_eval.app import App, build_app
from dropbox_eval.billing.accounts import Billing
from dropbox_eval.config import Settings
from dropbox_eval.errors import NotFoundError, StoreError
from dropbox_eval.models import BatchFile
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.files import append_lines
from dropbox_eval.util import crashpoints, fileio

FUND_SCRIPT = """
import sys
from pathlib import Path
from dropbox_eval.billing.accounts import Billing
from dropbox_eval.store.engine import TinyDBStore
billing = Billing(TinyDBStore(Path(sys.argv[1])), 1)
for _ in range(int(sys.argv[2])):
    billing.fund("acme", 1)
"""


def test_concurrent_funding_from_processes_and_threads_is_exact(tmp_path: Path) -> None:
    billing = Billing(TinyDBStore(tmp_path), 1)
    billing.add_client("acme", 0)
    procs = [
        subprocess.Popen([sys.executable, "-c", FUND_SCRIPT, str(tmp_path), "40"]) for _ in range(2)
    ]
    threads = [
        threading.Thread(target=lambda: [billing.fund("acme", 1) for _ in range(20)])
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert billing.client("acme").balance == 2 * 40 + 2 * 20
    ledger = billing.store.ledger("acme")
    assert len(ledger) == 120
    assert sorted(e.balance_after for e in ledger) == list(range(1, 121))


def test_corrupt_state_fails_loudly_and_is_not_reset(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    Billing(store, 1).add_client("acme", 5)
    index = tmp_path / "index.json"
    index.write_text('{"clients": {"1": {"client_id": "ac')
    with pytest.raises(StoreError, match="corrupt"):
        store.get_client("acme")
    assert index.read_text().startswith('{"clients"')


def test_stale_temp_files_are_removed_at_start(tmp_path: Path) -> None:
    TinyDBStore(tmp_path)
    stale = tmp_path / "batches" / ".x.json.abc.tmp"
    stale.write_text("half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    live = tmp_path / ".index.json.def.tmp"  # another process may be writing this one now
    live.write_text("{")
    TinyDBStore(tmp_path)
    assert not stale.exists()
    assert live.exists()


@pytest.mark.tinydb_files
def test_emitted_batches_leave_the_index_but_stay_visible(
    app: App, forge: SandboxForge, funded: str
) -> None:
    first = app.intake.submit_batch(funded, tasks(2), batch_ref="one")["batch_id"]
    finish_issues(forge, app.store.get_batch(first).repo)
    app.poller.poll_completed(first)
    app.delivery.emit(first)
    index = json.loads((app.settings.state_path / "index.json").read_text())
    assert index["batches"] == {}
    assert [e["kind"] for e in index["ledger"].values()] == ["fund"]
    assert [r.status for r in app.store.list_batches()] == ["emitted"]
    assert app.store.list_batches(live_only=True) == []
    kinds = [e.kind for e in app.store.ledger(funded)]
    assert kinds == ["fund", "hold", "charge", "release"]
    again = app.intake.submit_batch(funded, tasks(1), batch_ref="one")
    assert again["batch_id"] == first and again["duplicate"] is True
    app.delivery.emit(first, force=True)  # re-emit: archived once, not twice
    assert len(app.store.list_batches()) == 1
    assert len(app.store.ledger(funded)) == 4


@pytest.mark.tinydb_files
def test_duplicate_keys_are_written_as_the_batch_leaves_the_index(
    app: App, forge: SandboxForge, funded: str
) -> None:
    first = app.intake.submit_batch(funded, tasks(1), batch_ref="kept")["batch_id"]
    keys = app.store.keys_dir / funded
    assert not keys.exists()  # a live batch is found by its index row
    again = app.intake.submit_batch(funded, tasks(1), batch_ref="kept")
    assert again["batch_id"] == first and again["duplicate"] is True  # the live row found it
    finish_issues(forge, app.store.get_batch(first).repo)
    app.poller.poll_completed(first)
    app.delivery.emit(first)
    assert app.store.list_batches(live_only=True) == []
    assert (keys / "ref-kept").read_text(encoding="utf-8") == first
    later = app.intake.submit_batch(funded, tasks(1), batch_ref="kept")
    assert later["batch_id"] == first and later["duplicate"] is True


def test_archive_survives_a_line_cut_short(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    ledger = tmp_path / "archive" / "clients" / "x" / "ledger.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text('{"entry_id": "a", "client_id": "x"')  # a crash mid-append
    assert list(store.archive_rows.newest_ledger("x")) == []
    append_lines(ledger, [{"entry_id": "b", "client_id": "x"}])
    assert [e["entry_id"] for e in store.archive_rows.newest_ledger("x")] == ["b"]


@pytest.mark.parametrize("batch_id", ["../index", "a/b", "x" * 300, "Ṱo ïnvoke", "", ".."])
def test_unusable_batch_ids_are_simply_not_found(tmp_path: Path, batch_id: str) -> None:
    store = TinyDBStore(tmp_path)
    with pytest.raises(NotFoundError):
        store.get_batch(batch_id)
    with pytest.raises(NotFoundError):
        store.get_tasks(batch_id)


def test_ledger_entries_apply_to_the_balance_as_posted(app: App, funded: str) -> None:
    """Entries made before a concurrent change still add up (the store applies deltas)."""
    stale = app.billing.final_charge(funded, "b1", hold=0, charged=10)
    app.billing.fund(funded, 500)  # lands between computing and posting the settlement
    app.store.settle(stale)
    client = app.billing.client(funded)
    assert client.balance == 100 + 500 - 10
    assert app.store.ledger(funded)[-1].balance_after == client.balance


def test_intake_lease_excludes_a_second_holder(
    app: App, forge: SandboxForge, funded: str, settings: Settings
) -> None:
    offline = build_app(settings.model_copy(update={"gitea_url": None}))
    batch_id = offline.intake.submit_batch(funded, tasks(3))["batch_id"]
    forge.clear_requests()
    with app.store.claim_issues(batch_id) as mine:
        assert mine
        assert app.intake.open_issues(batch_id) == 0  # someone else is creating them
        assert forge.requests == []
    assert app.intake.open_issues(batch_id) == 3


@pytest.mark.tinydb_files
def test_a_batch_being_staged_is_left_alone_and_one_never_committed_leaves_no_file(
    app: App, funded: str
) -> None:
    """Intake writes a batch's files before it takes the store lock for its commit: the
    state check must not take them for a killed intake's leftovers meanwhile."""
    store, intake = app.store, app.intake
    spec = BatchFile.model_validate({"client_id": funded, "tasks": tasks(2)})
    record = intake.new_record(spec, funded, 2, "inbox/acme/a.json", None)
    records = intake.task_records(record, spec)
    with store.transaction(preparing=(record, records)) as tx:
        assert store.stored_batch_ids() == [record.batch_id]
        assert store.list_batches(live_only=True) == []
        assert store.being_recorded(record.batch_id)
        assert app.statecheck.run(repair=True) == []  # not a finding, nothing removed
        assert not store.drop_unrecorded(record.batch_id)
        assert store.stored_batch_ids() == [record.batch_id]
        tx.record_batch(record, records, app.billing.hold_entry(funded, 2, record.batch_id))
    assert not store.being_recorded(record.batch_id)
    assert app.billing.client(funded).held == 2
    assert len(store.get_tasks(record.batch_id)) == 2

    refused = intake.new_record(spec, funded, 2, "inbox/acme/b.json", None)
    with store.transaction(preparing=(refused, intake.task_records(refused, spec))):
        pass  # a duplicate or a refusal found in the transaction: not recorded
    assert store.stored_batch_ids() == [record.batch_id]
    assert not (store.tasks.live / f"{refused.batch_id}.json").exists()
    assert not (store.leases_dir / f"{refused.batch_id}.lock").exists()
    assert app.statecheck.run(repair=False) == []


def test_a_line_separator_inside_a_value_is_not_a_line_end(app: App, funded: str) -> None:
    """The store writes UTF-8 JSON lines, so U+2028 and U+2029 appear as themselves."""
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    task_id = app.store.get_tasks(batch_id)[0].task_id
    url = "https://forge.example/issues/1#one\u2028two\u2029three"
    app.store.update_tasks(batch_id, {task_id: {"issue_url": url}})
    assert app.store.get_tasks(batch_id)[0].issue_url == url


def test_a_redrop_of_a_live_batch_is_a_duplicate_even_when_funds_cover_only_one(
    settings: Settings,
) -> None:
    """The duplicate check comes before the funds check: a retried POST of a batch that
    holds all the client's credits is that batch, not `unfunded`."""
    app = build_app(settings.model_copy(update={"gitea_url": None}))
    app.billing.add_client("acme", app.billing.cost(1))  # exactly one one-task batch
    first = app.intake.submit_batch("acme", tasks(1), batch_ref="kept")
    assert first["ok"] and app.billing.client("acme").available == 0
    again = app.intake.submit_batch("acme", tasks(1), batch_ref="kept")
    assert again["ok"] and again["duplicate"] and again["batch_id"] == first["batch_id"]


@pytest.mark.tinydb_files
def test_a_commit_that_fails_after_its_rename_keeps_the_batch_files(
    app: App, funded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index write lands, then the folder's fsync fails: the batch is committed, so
    the failed intake must not remove its files (the state check would find a row whose
    record is gone, and a hold nobody can release)."""
    real = crashpoints.wrote

    def failing(name: str) -> None:
        real(name)
        if name == "index.json":
            raise OSError(5, "EIO on the folder's fsync")

    monkeypatch.setattr(fileio.crashpoints, "wrote", failing)
    app.intake.open_now = None
    with pytest.raises(OSError):
        app.intake.submit_batch(funded, tasks(1), batch_ref="r1")
    monkeypatch.setattr(fileio.crashpoints, "wrote", real)
    (row,) = app.store.list_batches(live_only=True)
    assert app.store.stored_batch_ids() == [row.batch_id]
    assert len(app.store.get_tasks(row.batch_id)) == 1
    assert app.statecheck.run(repair=False) == []


@pytest.mark.tinydb_files
def test_a_change_keeps_an_index_table_it_does_not_know(app: App, funded: str) -> None:
    path = app.store.state_dir / "index.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["newer"] = {"1": {"kept": True}}  # a table of a later version
    path.write_text(json.dumps(data), encoding="utf-8")
    app.billing.fund(funded, 5)
    assert json.loads(path.read_text(encoding="utf-8"))["newer"] == {"1": {"kept": True}}


def test_a_lane_result_orjson_refuses_is_stored_exactly(
    app: App, forge: SandboxForge, funded: str
) -> None:
    """A lane's ```json block may hold an integer past 64 bits or a lone surrogate: the
    store writes it (through the standard library) and reads it back digit for digit."""
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    owner, name = app.store.get_batch(batch_id).repo.split("/")
    details = '{"n": 123456789012345678901234567890, "s": "\\ud800"}'
    (issue,) = forge.issues(owner, name)
    comment = f"Checked.\n\n```json\n{details}\n```"
    forge.finish_issue(owner, name, issue["number"], comment=comment, labels=["eval-pass"])
    app.poller.poll_completed(batch_id, full=True)
    (task,) = app.store.get_tasks(batch_id)
    assert task.result is not None
    # jsonb cannot hold a lone surrogate: PostgreSQL keeps U+FFFD (test_store_postgres.py)
    kept = "\ud800" if app.store.flags() is None else "\ufffd"
    assert task.result.details == {"n": 123456789012345678901234567890, "s": kept}
