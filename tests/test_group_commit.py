"""The group commit of new batches (store/groupcommit.py): every intake waiting at the store
lock goes in with one index write; the duplicate and funds checks see the group's earlier
batches; a small batch's files are written unsynced, its copy in the index stands for them
until its record's first durable write."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import tasks, wait_for

from dropbox_eval.app import App
from dropbox_eval.errors import BatchRejected
from dropbox_eval.models import BatchFile
from dropbox_eval.store.engine import TinyDBStore

pytestmark = pytest.mark.tinydb_files  # the TinyDB engine's group commit of its index


def _drop(app: App, ref: str, count: int = 1, name: str = "") -> Callable[[], dict[str, Any]]:
    batch = BatchFile.model_validate({"batch_ref": ref, "tasks": tasks(count, ref)})
    return lambda: app.intake.accept(
        batch, "acme", source=f"acme/{name or ref}.json", sha256=ref * 8, open_now=False
    )


@pytest.fixture
def index_writes(app: App, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per index write of the app's store."""
    store = app.store
    assert isinstance(store, TinyDBStore)
    written: list[int] = []
    real = store.write_index

    def counted(data: dict[str, Any]) -> None:
        written.append(len(data["batches"]))
        real(data)

    monkeypatch.setattr(store, "write_index", counted)
    return written


def _together(store: TinyDBStore, calls: list[Callable[[], Any]]) -> Iterator[Any]:
    """Run `calls` in threads that all queue at the store lock before any commits, in
    the order given (each thread starts once the one before it is queued)."""
    answers: list[Any] = [None] * len(calls)

    def run(n: int) -> None:
        try:
            answers[n] = calls[n]()
        except BatchRejected as exc:
            answers[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    with store.locked():
        for n, thread in enumerate(threads, start=1):
            thread.start()
            assert wait_for(lambda n=n: store.queued == n)
    for thread in threads:
        thread.join(60)
    return iter(answers)


def test_intakes_waiting_at_the_lock_are_committed_in_one_index_write(
    app: App, funded: str, index_writes: list[int]
) -> None:
    store = app.store
    assert isinstance(store, TinyDBStore)
    receipts = list(_together(store, [_drop(app, f"g{n}") for n in range(6)]))
    assert len(index_writes) == 1 and index_writes == [6]
    assert len({r["batch_id"] for r in receipts}) == 6
    assert all(r["status"] == "in_progress" for r in receipts)
    client = app.billing.client(funded)
    assert client.held == 6 * 2 and len(store.list_batches()) == 6


def test_the_checks_see_the_batches_earlier_in_the_group(app: App, index_writes: list[int]) -> None:
    app.billing.add_client("acme", 6)  # three one-task batches at price 2
    store = app.store
    assert isinstance(store, TinyDBStore)
    before = len(index_writes)
    calls = [_drop(app, "same"), _drop(app, "same", name="again")] + [
        _drop(app, f"o{n}") for n in range(3)
    ]
    answers = list(_together(store, calls))
    first, again, *others = answers
    assert again["batch_id"] == first["batch_id"] and again["duplicate"] is True
    refused = [a for a in others if isinstance(a, BatchRejected)]
    assert [r.reason for r in refused] == ["unfunded"]
    assert len(store.list_batches()) == 3 and app.billing.client("acme").held == 6
    assert index_writes[before:] == [3]


def test_a_lone_small_intake_costs_one_fsync_pair(
    app: App, funded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    receipt = _drop(app, "lone")()
    assert len(synced) == 2  # the index and its folder; the record and tasks ride in it
    assert app.store.get_batch(receipt["batch_id"]).total == 1


def test_a_fresh_batch_lost_to_a_power_loss_is_written_back(app: App, funded: str) -> None:
    batch_id = _drop(app, "lost", 3)()["batch_id"]
    state = app.store.state_dir
    (state / "batches" / f"{batch_id}.json").unlink()  # never synced: a power loss took it
    (state / "tasks" / f"{batch_id}.json").write_bytes(b"")  # or left it empty
    reopened = TinyDBStore(state)
    restored = reopened.get_batch(batch_id)
    assert restored.batch_ref == "lost" and restored.open_started  # its issues: adopted
    assert [t.task_id for t in reopened.get_tasks(batch_id)] == ["lost1", "lost2", "lost3"]


def test_the_fresh_copy_goes_once_the_record_is_written_durably(app: App, funded: str) -> None:
    store = app.store
    assert isinstance(store, TinyDBStore)
    batch_id = _drop(app, "sealed")()["batch_id"]
    assert batch_id in store.index_data()["fresh"]
    store.update_batch(batch_id, filed=True)  # unsynced: the copy stays
    assert batch_id in store.index_data()["fresh"]
    store.update_batch(batch_id, open_started=True)  # synced, its tasks first
    app.billing.fund("acme", 1)  # the next index write leaves the copy out
    assert batch_id not in store.index_data().get("fresh", {})
    reopened = TinyDBStore(store.state_dir)
    assert reopened.get_batch(batch_id).filed and reopened.get_batch(batch_id).open_started
