"""The TinyDB engine of the store contract (contract.py): files under the state folder,
laid out as `store/__init__.py` tells, each replaced atomically or appended, in a write
order that a restart completes (statecheck.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from typing import Any

from ..errors import NotFoundError, StoreError
from ..models import BatchRecord, LedgerEntry, TaskRecord, is_valid_id
from .archiving import Archiving
from .audit import AuditTrail
from .base import StoreBase
from .clients import ClientStore, post_entry, settle_once
from .files import read_table, write_table
from .groupcommit import GroupCommit
from .listing import BatchListing
from .nodes import SoloNode
from .reports import Reports
from .rows import SUMMARY_FIELDS, dump, encode, insert, summary_row
from .tombstones import Tombstones
from .transaction import PendingChanges

LEASE_WAIT = 10.0  # seconds a store-lock holder waits for a new batch's lease
# Record fields written to a fresh batch's record without a sync (groupcommit.py): losing
# `filed` to a power loss only makes the same drop, dropped again, resume, not duplicate.
LAZY_FIELDS = frozenset({"filed"})
_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="store-beside")


class TinyDBStore(
    Tombstones, Archiving, Reports, BatchListing, ClientStore, AuditTrail, GroupCommit, StoreBase
):
    """The store contract over the state folder; safe across threads and processes."""

    _open_transaction = threading.local()

    def close(self) -> None:
        """Nothing is held open between calls (the contract's `close`)."""

    def node(self, node_id: str, lease_seconds: float) -> SoloNode:
        """One machine, one node: the state folder's lock keeps it the only one."""
        return SoloNode(node_id)

    def flags(self) -> None:
        """The state folder's files are every process's on this machine."""
        return None

    @contextlib.contextmanager
    def transaction(
        self, *, preparing: tuple[BatchRecord, list[TaskRecord]] | None = None
    ) -> Iterator[PendingChanges]:
        """The store lock over the block; its changes are written as it ends, in the order
        made (each in the engine's safe write order), none if it raises. One opened inside
        another in this thread joins it. A batch `preparing` has its files written before
        the lock is taken, their fsyncs beside other intakes' (`staged`)."""
        joined: PendingChanges | None = getattr(self._open_transaction, "tx", None)
        if joined is not None and joined.store is self:
            yield joined
            return
        tx = PendingChanges(self)
        with contextlib.ExitStack() as stack:
            if preparing is not None:
                batch, tasks = preparing
                tx.ready[batch.batch_id] = stack.enter_context(self.staged(batch, tasks))
            with self.locked():
                self._open_transaction.tx = tx
                try:
                    yield tx
                finally:
                    self._open_transaction.tx = None
                tx.commit()
        tx.run_after()

    def commit_batch(
        self,
        batch: BatchRecord,
        tasks: list[TaskRecord],
        hold: LedgerEntry | None,
        ready: Callable[[LedgerEntry | None], None] | None = None,
    ) -> None:
        """Record a new batch: its files staged (unless `ready` commits them, staged
        already), then its index row and hold in one write, under the store lock. The
        lease is waited for a bounded time: a caller holding the store lock must not wait
        for ever on a lease whose holder may be waiting for that lock."""
        if ready is not None:
            ready(hold)
            return
        with self.staged(batch, tasks, wait=LEASE_WAIT) as commit, self.locked():
            commit(hold)

    @contextlib.contextmanager
    def staged(
        self, batch: BatchRecord, tasks: list[TaskRecord], *, wait: float = -1
    ) -> Iterator[Callable[..., None]]:
        """Write a new batch's tasks and record (and its lease file), then yield `commit`,
        which writes its index row and hold in one atomic write; the caller calls it under
        the store lock, after its own checks. Its duplicate keys come when it is archived.

        The files are written before the store lock is taken, side by side, their fsyncs
        overlapping: nothing reads them before the index names the batch, so concurrent
        intakes queue on the lock only for the commit. The batch's lease is held meanwhile:
        the state check leaves a batch whose lease is held alone (`being_recorded`). Not
        committed (a duplicate, a refusal, an error before the commit's rename), the files
        are removed, unless the index names the batch after all; a crash before
        the commit leaves only unreferenced files, never a batch without its hold, and the
        state check removes them (`drop_unrecorded`): the drop is read again, or the API
        caller got no receipt.
        """
        committed = False

        def commit(hold: LedgerEntry | None, into: dict[str, Any] | None = None) -> None:
            """`into`: the index a group commit writes (groupcommit.py), else its own."""
            nonlocal committed
            with contextlib.nullcontext(into) if into is not None else self._index_change() as data:
                self.index_new(data, batch, hold)
            committed = True

        with self.claim_issues(batch.batch_id, wait=wait) as leased:
            if not leased:
                raise StoreError(f"batch {batch.batch_id} is busy elsewhere; try again")
            try:
                self._write_new_files(batch, tasks)
                yield commit
            finally:
                if not committed:
                    self._remove_unnamed(batch.batch_id)

    @staticmethod
    def index_new(data: dict[str, Any], batch: BatchRecord, hold: LedgerEntry | None) -> None:
        """A new batch's row and hold put in the index `data` (read under the lock)."""
        insert(data["batches"], summary_row(batch))
        if hold is not None:
            post_entry(data, hold)

    def _remove_unnamed(self, batch_id: str) -> None:
        """A stage that did not commit: its files go, unless the commit's rename landed
        and only what followed it failed (an fsync of the folder)."""
        with self.locked():
            if not self.index_names(batch_id):
                self._remove_batch_files(batch_id)

    def _write_new_files(self, batch: BatchRecord, tasks: list[TaskRecord]) -> None:
        beside = _BESIDE.submit(copy_context().run, self.tasks.create_from, batch.batch_id, tasks)
        try:
            write_table(self.batches_dir / f"{batch.batch_id}.json", "batch", [dump(batch)])
        finally:
            beside.result()
        self.parsed_tasks.seed(batch.batch_id, tasks)  # its opener reads them next

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record; NotFoundError when unknown."""
        if not is_valid_id(batch_id):
            raise NotFoundError(f"no batch {batch_id!r}")
        for _ in range(2):  # the batch may move to the archive between finding and reading
            path = self._batch_file(batch_id)
            if not path.exists():
                continue  # moved since `_batch_file` looked: look again
            with self._open(path) as db:
                row = db.table("batch").get(doc_id=1)
            if row is not None:
                return BatchRecord.model_validate(row)
        if not self._batch_file(batch_id).exists():
            archived = self.archived_record(batch_id)  # the history (archiving.py)
            if archived is None:
                raise NotFoundError(f"no batch {batch_id!r}")
            return archived
        raise StoreError(f"{path} has no batch row")

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """Every task of the batch in file order; parsed again only when its base file
        changed, else brought up to date by the journal's new lines (taskcache.py). The
        caller must not change them in place."""
        if not is_valid_id(batch_id):
            raise NotFoundError(f"no batch {batch_id!r}")
        tasks = self.parsed_tasks.get(batch_id)
        if tasks is None:
            tasks = self.archived_tasks(batch_id)  # the history (archiving.py)
        if tasks is None:
            raise NotFoundError(f"no batch {batch_id!r}")
        return tasks

    def issue_numbers(self, batch_id: str) -> dict[str, int | None]:
        """task_id -> the issue number recorded so far (None: none yet), in file order."""
        return {task.task_id: task.issue_number for task in self.get_tasks(batch_id)}

    def update_tasks(self, batch_id: str, changes: dict[str, dict[str, Any]]) -> None:
        """Record per-task field changes keyed by task_id: one appended line, whatever the
        size of the batch."""
        if not changes:
            return
        encoded = {
            task_id: {k: encode(v) for k, v in fields.items()}
            for task_id, fields in changes.items()
        }
        with self.record_locked(batch_id):
            self.parsed_tasks.append(batch_id, encoded)

    def update_batch(
        self,
        batch_id: str,
        *,
        settlement: list[LedgerEntry] | None = None,
        when: Callable[[BatchRecord], bool] | None = None,
        **fields: Any,
    ) -> BatchRecord:
        """Change batch fields; returns the new record.

        Write order (every prefix is completed by a restart, `statecheck.py`): the record
        first, since it owns the batch's facts (status, completion, charges, delivery); then
        what derives from it in one index write: its row (a cache) and, when the batch ends,
        the ledger's `settlement` (posted once). An emitted batch is archived instead.
        A `report` (the close's) is fixed beside the record before it (reports.py).
        """
        report: bytes | Iterable[bytes] | None = fields.pop("report", None)
        if report is not None:
            with self.record_locked(batch_id):
                self.write_report(batch_id, report)
        encoded = {k: encode(v) for k, v in fields.items()}
        if not settlement and not any(key in SUMMARY_FIELDS for key in fields):
            with self.record_locked(batch_id):  # the record alone: no store lock
                batch = self._rewrite_record(batch_id, encoded, when)
            if batch.emitted_at is not None:  # an archive a crash left unfinished
                self.archive(batch)
            return batch
        with self.locked():
            with self.record_locked(batch_id):
                batch = self._rewrite_record(batch_id, encoded, when)
            if batch.emitted_at is not None:
                self.archive(batch)
            else:
                with self._index_change() as data:
                    _refresh_row(data, batch)
                    if settlement:
                        settle_once(data, settlement)
        return batch

    def _rewrite_record(
        self,
        batch_id: str,
        encoded: dict[str, Any],
        when: Callable[[BatchRecord], bool] | None = None,
    ) -> BatchRecord:
        """One read and one write of the record (its one row), none when `when` refuses the
        record as read; the caller holds its lock."""
        path = self._batch_file(batch_id)
        rows = read_table(path, "batch")
        archived = not rows and self.history.record(batch_id)  # the history (archiving.py)
        if archived:
            rows = [archived]
        if not rows:
            raise NotFoundError(f"no batch {batch_id!r}")
        if when is not None and not when(current := BatchRecord.model_validate(rows[0])):
            return current
        row = {**rows[0], **encoded}
        if archived:
            self.rewrite_archived(row)
        elif set(encoded) <= LAZY_FIELDS and batch_id in self.fresh_ids:
            write_table(path, "batch", [row], False)  # the fresh copy stands for it
        else:
            with self.sealing(batch_id):  # a fresh copy may go once this lands
                write_table(path, "batch", [row])
        return BatchRecord.model_validate(row)

    def refresh_row(self, batch: BatchRecord) -> None:
        """Rewrite a live batch's index row from its record (the row is a cache)."""
        with self._index_change() as data:
            _refresh_row(data, batch)


def _refresh_row(data: dict[str, dict[str, Any]], batch: BatchRecord) -> None:
    for key, index_row in data["batches"].items():
        if index_row["batch_id"] == batch.batch_id:  # replaced, not edited (`_writable`)
            data["batches"][key] = {**index_row, **summary_row(batch)}
