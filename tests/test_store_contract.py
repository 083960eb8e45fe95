"""The store contract (store/contract.py), checked the same way against every engine: each
operation, transactions (all or nothing, their own reads, joining, after-commit actions)
and the typed queries. A new engine joins by adding its constructor to ENGINES: TinyDB on
a temp folder, PostgreSQL on a fresh database of the session's private cluster
(pgcluster.py; a missing PostgreSQL fails these tests, never skips them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pgcluster
import pytest
from helpers import ledger_entry

from dropbox_eval.errors import NotFoundError
from dropbox_eval.models import (
    BatchRecord,
    BatchStatus,
    Client,
    TaskRecord,
    TaskSpec,
    TaskStatus,
    new_batch_id,
    utcnow,
)
from dropbox_eval.protocol.report import ReportPieces, report_document
from dropbox_eval.store import BatchRow, Store
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.pg.engine import PostgresStore
from dropbox_eval.util import crashpoints


def _postgres(request: pytest.FixtureRequest, state: Path) -> Store:
    cluster: pgcluster.Cluster = request.getfixturevalue("pg_cluster")
    return PostgresStore(cluster.fresh_url(), state)


ENGINES: dict[str, Callable[[pytest.FixtureRequest, Path], Store]] = {
    "tinydb": lambda request, state: TinyDBStore(state),
    "postgres": _postgres,
}


@pytest.fixture(params=sorted(ENGINES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made = ENGINES[request.param](request, tmp_path / "state")
    with made.transaction() as tx:
        tx.add_client(Client(client_id="acme", created_at=utcnow()))
        tx.post_ledger(ledger_entry("fund", 100))
    yield made
    if isinstance(made, PostgresStore):
        made.close()


def _batch(ref: str, *, client_id: str = "acme", ago: int = 0) -> BatchRecord:
    created = utcnow() - timedelta(seconds=ago)
    return BatchRecord(
        batch_id=new_batch_id(created),
        client_id=client_id,
        batch_ref=ref,
        repo=f"Acme/Repo-{ref}",
        sha256=f"sha-{ref}",
        total=2,
        cost=2,
        unit_price=1,
        created_at=created,
    )


def _tasks(batch: BatchRecord) -> list[TaskRecord]:
    return [
        TaskRecord(
            task_id=f"t{n}",
            batch_id=batch.batch_id,
            repo=batch.repo,
            payload=TaskSpec(task_id=f"t{n}", title=f"task {n}"),
            created_at=batch.created_at,
        )
        for n in (1, 2)
    ]


def _record(store: Store, batch: BatchRecord) -> BatchRecord:
    with store.transaction() as tx:
        tx.record_batch(batch, _tasks(batch), ledger_entry("hold", 0, 2, batch.batch_id))
    return batch


def test_a_recorded_batch_is_read_back_whole(store: Store) -> None:
    batch = _record(store, _batch("one"))
    assert store.get_batch(batch.batch_id) == batch
    assert [t.task_id for t in store.get_tasks(batch.batch_id)] == ["t1", "t2"]
    assert store.is_recorded(batch.batch_id) and not store.is_recorded("nothing")
    assert store.find_batch("acme", batch_ref="one") == batch.batch_id
    assert store.find_batch("acme", sha256="sha-one") == batch.batch_id
    assert store.find_batch("other", batch_ref="one") is None
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (100, 2)
    assert [e.kind for e in store.ledger("acme")] == ["fund", "hold"]
    assert store.ledger("acme", limit=1)[0].held_after == 2
    assert store.live_repos() == {"acme/repo-one"}
    with pytest.raises(NotFoundError):
        store.get_batch("unknown")


def test_changes_to_a_batch_and_its_tasks(store: Store) -> None:
    batch = _record(store, _batch("one"))
    changed = store.update_batch(batch.batch_id, filed=True, done=1)
    assert changed.filed and store.get_batch(batch.batch_id).done == 1
    assert store.list_batches(batch_id=batch.batch_id)[0].done == 1  # the row follows
    refused = store.update_batch(batch.batch_id, when=lambda b: not b.filed, done=2)
    assert refused.done == 1 == store.get_batch(batch.batch_id).done
    store.update_tasks(batch.batch_id, {"t2": {"status": TaskStatus.OPEN, "issue_number": 7}})
    t1, t2 = store.get_tasks(batch.batch_id)
    assert (t1.status, t2.status, t2.issue_number) == (TaskStatus.PENDING, TaskStatus.OPEN, 7)


def test_a_batch_ends_settled_once_then_leaves_the_live_batches(store: Store) -> None:
    batch = _record(store, _batch("one"))
    release = [
        ledger_entry("charge", -1, 0, batch.batch_id),
        ledger_entry("release", 0, -2, batch.batch_id),
    ]
    with store.transaction() as tx:
        ended = tx.update_batch(
            batch.batch_id, settlement=release, status=BatchStatus.COMPLETED, charged=1
        )
        assert ended.status == BatchStatus.COMPLETED
    assert not store.settle(release)  # settled already: nothing posted twice
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (99, 0)
    emitted = store.update_batch(batch.batch_id, emitted_at=utcnow())  # archives it
    store.archive(emitted)  # again: nothing changes
    assert store.list_batches(live_only=True) == [] and store.live_repos() == set()
    assert [r.status for r in store.list_batches()] == [BatchStatus.COMPLETED]
    assert store.find_batch("acme", batch_ref="one") == batch.batch_id
    assert store.count_batches() == {"completed": 1} == store.count_batches("acme")
    assert store.snapshot().archived.batches == {"completed": 1}
    assert [e.kind for e in store.ledger("acme")] == ["fund", "hold", "charge", "release"]


def test_the_report_fixed_at_the_close_is_kept_as_bytes_into_the_history(store: Store) -> None:
    batch = _record(store, _batch("one"))
    assert store.get_report(batch.batch_id) is None  # none before the close
    report = b'{\n  "batch_id": "%s",\n  "results": []\n}\n' % batch.batch_id.encode()
    store.update_batch(batch.batch_id, report=report, status=BatchStatus.COMPLETED)
    assert store.get_report(batch.batch_id) == report
    store.update_batch(batch.batch_id, emitted_at=utcnow())  # archives it
    assert store.get_report(batch.batch_id) == report


def test_the_fixed_report_opens_as_a_file_to_read_live_and_archived(store: Store) -> None:
    """Delivery and the API copy a report from `open_report` a block at a time."""
    batch = _record(store, _batch("one"))
    assert store.open_report(batch.batch_id) is None  # none before the close
    assert store.open_report("20990101-000000-000000000") is None  # unknown
    report = b'{\n  "batch_id": "%s",\n  "results": []\n}\n' % batch.batch_id.encode()
    store.update_batch(batch.batch_id, report=report, status=BatchStatus.COMPLETED)
    live = store.open_report(batch.batch_id)
    assert live is not None
    with live:
        assert live.read(10) + live.read() == report
        store.update_batch(batch.batch_id, emitted_at=utcnow())  # archived while open
        live.seek(0)
        assert live.read() == report  # what was opened stays readable
    archived = store.open_report(batch.batch_id)
    assert archived is not None
    with archived:
        assert archived.read() == report


def test_a_report_given_in_pieces_is_fixed_as_their_bytes(store: Store) -> None:
    """The close hands the report over in pieces (protocol/report.py `ReportPieces`): the
    files engine writes them as they are made, PostgreSQL stores them as one value."""
    batch = _record(store, _batch("one"))
    final = batch.model_copy(update={"status": BatchStatus.COMPLETED, "completed_at": utcnow()})
    pieces = ReportPieces(final, store.get_tasks(batch.batch_id))
    with store.transaction() as tx:
        tx.update_batch(batch.batch_id, report=pieces, status=BatchStatus.COMPLETED)
    assert (
        store.get_report(batch.batch_id)
        == bytes(pieces)
        == report_document(final, store.get_tasks(batch.batch_id))
    )
    other = _record(store, _batch("two"))
    store.update_batch(other.batch_id, report=[b"{", b"}\n"], status=BatchStatus.COMPLETED)
    assert store.get_report(other.batch_id) == b"{}\n"


def test_typed_queries_select_by_client_status_batch_repo_and_time(store: Store) -> None:
    with store.transaction() as tx:
        tx.add_client(Client(client_id="beta", created_at=utcnow()))
    old = _record(store, _batch("old", ago=60))
    new = _record(store, _batch("new"))
    theirs = _record(store, _batch("theirs", client_id="beta", ago=30))
    store.update_batch(old.batch_id, status=BatchStatus.FAILED)
    rows = store.list_batches(live_only=True)
    assert all(isinstance(r, BatchRow) for r in rows)
    assert [r.batch_id for r in rows] == [old.batch_id, theirs.batch_id, new.batch_id]
    assert [r.batch_id for r in store.list_batches(client_id="beta")] == [theirs.batch_id]
    failed = store.list_batches(status=BatchStatus.FAILED)
    assert [(r.batch_id, r.status) for r in failed] == [(old.batch_id, "failed")]
    assert [r.batch_ref for r in store.list_batches(batch_id=new.batch_id)] == ["new"]
    assert [r.batch_ref for r in store.list_batches(repo="acme/REPO-new")] == ["new"]
    page = store.page_batches(client_id="acme", limit=1)  # newest created first
    assert [r.batch_id for r in page] == [new.batch_id]
    assert [r.batch_id for r in store.page_batches(client_id="acme", offset=1)] == [old.batch_id]
    assert [r.batch_id for r in store.page_batches(finished=True)] == [old.batch_id]
    assert store.count_batches("acme") == {"running": 1, "failed": 1}
    assert rows[0] == BatchRow.of(store.get_batch(old.batch_id))
    assert rows[0].as_dict()["created_at"].startswith(f"{old.created_at:%Y-%m-%dT%H:%M:%S}")


def test_a_transaction_that_raises_changes_nothing(store: Store) -> None:
    batch = _batch("lost")
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.record_batch(batch, _tasks(batch), ledger_entry("hold", 0, 2, batch.batch_id))
        tx.post_ledger(ledger_entry("fund", 5))
        tx.update_client("acme", webhook_secret="whsec_new")
        raise RuntimeError("a check failed after the changes were made")
    assert store.list_batches() == [] and store.stored_batch_ids() == []
    assert not store.is_recorded(batch.batch_id)
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (100, 0)
    assert client.webhook_secret is None


def test_a_prepared_batch_not_recorded_leaves_nothing(store: Store) -> None:
    batch = _batch("prepared")
    with store.transaction(preparing=(batch, _tasks(batch))):
        assert store.list_batches(live_only=True) == []  # unseen until recorded
    assert store.stored_batch_ids() == [] and not store.being_recorded(batch.batch_id)
    with store.transaction(preparing=(batch, _tasks(batch))) as tx:
        tx.record_batch(batch, _tasks(batch), None)
    assert [r.batch_id for r in store.list_batches()] == [batch.batch_id]
    assert not store.drop_unrecorded(batch.batch_id)  # recorded: kept


def test_a_transaction_reads_its_own_changes_and_others_see_them_at_the_end(
    store: Store,
) -> None:
    batch = _record(store, _batch("one"))
    with store.transaction() as tx:
        tx.update_tasks(batch.batch_id, {"t1": {"status": TaskStatus.PASSED}})
        tx.update_batch(batch.batch_id, done=1)
        assert [t.status for t in tx.get_tasks(batch.batch_id)][0] == TaskStatus.PASSED
        assert tx.get_batch(batch.batch_id).done == 1
        assert store.get_batch(batch.batch_id).done == 0  # not landed yet
        assert store.get_tasks(batch.batch_id)[0].status == TaskStatus.PENDING
    assert store.get_batch(batch.batch_id).done == 1
    assert store.get_tasks(batch.batch_id)[0].status == TaskStatus.PASSED


def test_a_nested_transaction_joins_and_after_commit_waits_for_the_end(store: Store) -> None:
    batch = _record(store, _batch("one"))
    seen: list[int] = []
    with store.transaction() as outer:
        outer.update_batch(batch.batch_id, done=1)
        with store.transaction() as inner:
            assert inner.get_batch(batch.batch_id).done == 1  # the outer's change
            inner.update_batch(batch.batch_id, filed=True)
            inner.after_commit(lambda: seen.append(store.get_batch(batch.batch_id).done))
        assert seen == [] and not store.get_batch(batch.batch_id).filed
    assert seen == [1] and store.get_batch(batch.batch_id).filed
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.after_commit(lambda: seen.append(0))
        raise RuntimeError
    assert seen == [1]


def test_a_transaction_excludes_other_threads_until_it_ends(store: Store) -> None:
    order: list[str] = []
    inside = threading.Event()

    def other() -> None:
        inside.wait()
        with store.transaction() as tx:
            order.append("other")
            tx.post_ledger(ledger_entry("fund", 1))

    thread = threading.Thread(target=other)
    thread.start()
    with store.transaction() as tx:
        inside.set()
        thread.join(timeout=0.2)  # not a bound: the other must still be waiting after it
        order.append("first")
        tx.post_ledger(ledger_entry("fund", 1))
    thread.join()
    assert order == ["first", "other"]
    assert [e.balance_after for e in store.ledger("acme")][-2:] == [101, 102]


def test_issues_are_claimed_by_one_holder_at_a_time(store: Store) -> None:
    batch = _record(store, _batch("one"))
    answers: list[bool] = []

    def second() -> None:
        with store.claim_issues(batch.batch_id) as mine:
            answers.append(mine)

    with store.claim_issues(batch.batch_id) as first:
        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
    second()
    assert (first, answers) == (True, [False, True])


def test_durable_writes_are_counted_as_the_transaction_lands(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash-point walk counts an engine's durable writes: a transaction's land when
    its block ends, none before: each file replaced, or the one COMMIT."""
    written: list[str] = []
    real = crashpoints.wrote

    def counted(what: str) -> None:
        written.append(what)
        real(what)

    monkeypatch.setattr(crashpoints, "wrote", counted)
    batch = _batch("one")
    with store.transaction() as tx:
        tx.record_batch(batch, _tasks(batch), ledger_entry("hold", 0, 2, batch.batch_id))
        tx.post_ledger(ledger_entry("fund", 1))
        assert written == []
    if isinstance(store, PostgresStore):
        assert written == ["pg:batches"]  # the batch and the ledger entry: one COMMIT
    else:
        assert len(written) >= 2  # at least the batch and the ledger entry


@pytest.fixture
def _no_leftovers(store: Store) -> Iterator[None]:
    yield
    assert store.stored_batch_ids() == [r.batch_id for r in store.list_batches(live_only=True)]


def test_the_state_check_operations_agree_on_a_clean_store(
    store: Store, _no_leftovers: None
) -> None:
    batch = _record(store, _batch("one"))
    assert store.stored_batch_ids() == [batch.batch_id]
    assert not store.being_recorded(batch.batch_id)
    store.refresh_row(store.get_batch(batch.batch_id))
    assert store.list_batches(live_only=True) == [BatchRow.of(batch)]


def _ended(store: Store, ref: str, *, emit: bool = True) -> BatchRecord:
    """A batch recorded, settled (charged 1) and, if `emit`, archived."""
    batch = _record(store, _batch(ref))
    settlement = [
        ledger_entry("charge", -1, 0, batch.batch_id),
        ledger_entry("release", 0, -2, batch.batch_id),
    ]
    ended = store.update_batch(
        batch.batch_id, settlement=settlement, status=BatchStatus.COMPLETED, charged=1
    )
    return store.update_batch(batch.batch_id, emitted_at=utcnow()) if emit else ended


def test_history_pages_follow_the_archiving_order_and_leave_buried_batches_out(
    store: Store,
) -> None:
    first, second, third = (_ended(store, ref) for ref in ("a", "b", "c"))
    live = _record(store, _batch("live"))
    page = store.history_page(limit=2)
    assert [r.batch_id for r in page.rows] == [third.batch_id, second.batch_id]
    assert page.next_cursor is not None
    rest = store.history_page(limit=2, cursor=page.next_cursor)
    assert ([r.batch_id for r in rest.rows], rest.next_cursor) == ([first.batch_id], None)
    listed = [r.batch_id for r in store.page_batches(limit=10)]
    assert listed == [live.batch_id, third.batch_id, second.batch_id, first.batch_id]
    assert [r.batch_id for r in store.page_batches(after=third.batch_id)] == [
        second.batch_id,
        first.batch_id,
    ]
    assert store.bury_batch(second.batch_id, reason="test")
    assert not store.bury_batch(second.batch_id, reason="test")  # buried already
    assert not store.bury_batch(live.batch_id, reason="test")  # live
    with pytest.raises(NotFoundError):
        store.get_batch(second.batch_id)
    assert [r.batch_id for r in store.history_page(limit=5).rows] == [
        third.batch_id,
        first.batch_id,
    ]
    assert store.count_batches() == {"completed": 2, "running": 1}
    assert store.snapshot().archived.batches == {"completed": 2}
    with pytest.raises(ValueError):
        store.history_page(cursor="not-a-cursor")


def test_an_erased_batch_leaves_a_tombstone_and_its_money(store: Store) -> None:
    batch = _ended(store, "gone", emit=False)  # ended and settled, still live
    tombstone = {"deleted_by": "operator", "status": "completed"}
    store.erase_batch(batch, tombstone)
    assert store.tombstone(batch.batch_id) == tombstone
    assert store.tombstone(_batch("other").batch_id) is None
    with pytest.raises(NotFoundError):
        store.get_batch(batch.batch_id)
    assert store.find_batch("acme", batch_ref="gone") is None  # dropped again: a new batch
    assert store.list_batches() == [] and store.count_batches() == {}
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (99, 0)
    assert [e.kind for e in store.ledger("acme")] == ["fund", "hold", "charge", "release"]
    assert store.snapshot().archived.charged == {"acme": 1}


def test_the_audit_log_keeps_every_action_in_order(store: Store) -> None:
    store.record_action("fund", "acme", actor="ann", via="cli", amount=5)
    store.record_action("pause", "", actor="bob", via="page", result="conflict", key_id="k1")
    first, newest = store.audit_entries()
    assert (first.action, first.target, first.actor, first.detail) == (
        "fund",
        "acme",
        "ann",
        {"amount": 5},
    )
    assert (newest.target, newest.result, newest.key_id) == ("-", "conflict", "k1")
    assert store.audit_entries(limit=1) == [newest]
