"""TinyDB behind a small repository API; the only package that imports tinydb.

Layout under the state folder::

    index.json                    clients, the live ledger, one summary row per live batch,
                                  counts of archived batches (per client, per status) and
                                  running totals of the archive (totals.py)
    batches/<batch_id>.json       a live batch's record (one small row)
    tasks/<batch_id>.json         a live batch's tasks, written once at intake ...
    tasks/<batch_id>.journal      ... plus one JSON line per change (tasks.py)
    keys/<client_id>/<key>        duplicate-drop keys (sha256 of the bytes, batch_ref) -> id
    archive/batches.jsonl         summary rows of emitted batches (append-only)
    archive/clients/<client_id>/  that client's archived batch rows and ledger entries
    archive/<YYYYMM>/             emitted batches' record and task files, moved out of the
                                  live folders (nothing globs them)
    leases/<batch_id>.lock        per-batch lease of a live batch
    store.lock                    inter-process lock held around every read-modify-write

No operation's cost grows with the history: writes cost the change, the index and the live
folders hold only live batches, duplicate lookups are one file name, and listings read the
newest page from the end of an append-only file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from typing import Any

from ..errors import NotFoundError, StoreError
from ..models import BatchRecord, LedgerEntry, TaskRecord, is_valid_id, utcnow
from ..util import crashpoints
from ..util.fileio import write_atomically
from . import totals
from .base import SUMMARY_FIELDS, _dump, _encode, _insert, summary_row
from .clients import _post, settle_once
from .files import AtomicJSONStorage, append_lines, read_table, unlink_quietly, write_table
from .listing import BatchListing, duplicate_keys
from .tasks import Signature

__all__ = ["AtomicJSONStorage", "Store", "append_lines"]
LEASE_WAIT = 10.0  # seconds a store-lock holder waits for a new batch's lease
CACHED_TASKS = 20_000  # parsed tasks kept while their files are unchanged (memory-bounded)
_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="store-beside")


class Store(BatchListing):
    """Repository API over the state folder; safe across threads and processes."""

    def create_batch(
        self, batch: BatchRecord, tasks: list[TaskRecord], hold: LedgerEntry | None = None
    ) -> None:
        """Stage the batch's files, then commit its index row and hold (`staged_batch`);
        under the store lock when the caller holds it (a retry), else taking it to commit.
        The lease is waited for a bounded time: a caller holding the store lock must not
        wait for ever on a lease whose holder may be waiting for that lock."""
        with self.staged_batch(batch, tasks, wait=LEASE_WAIT) as commit, self.locked():
            commit(hold)

    @contextlib.contextmanager
    def staged_batch(
        self, batch: BatchRecord, tasks: list[TaskRecord], *, wait: float = -1
    ) -> Iterator[Callable[[LedgerEntry | None], None]]:
        """Write a new batch's tasks and record (and its lease file), then yield `commit`,
        which writes its index row and hold in one atomic write; the caller calls it under
        the store lock, after its own checks. Its duplicate keys come when it is archived.

        The files are written before the store lock is taken, side by side, their fsyncs
        overlapping: nothing reads them before the index names the batch, so concurrent
        intakes queue on the lock only for the commit. The batch's lease is held meanwhile:
        the state check leaves a batch whose lease is held alone (`being_staged`). Not
        committed (a duplicate, a refusal, an error before the commit's rename), the files
        are removed, unless the index names the batch after all; a crash before
        the commit leaves only unreferenced files, never a batch without its hold, and the
        state check removes them (`discard_unrecorded`): the drop is read again, or the API
        caller got no receipt.
        """
        committed = False

        def commit(hold: LedgerEntry | None) -> None:
            nonlocal committed
            with self._index_change() as data:
                _insert(data["batches"], summary_row(batch))
                if hold is not None:
                    _post(data, hold)
            committed = True

        self._new_lease(batch.batch_id)
        with self.intake_lease(batch.batch_id, wait=wait) as leased:
            if not leased:
                raise StoreError(f"batch {batch.batch_id} is busy elsewhere; try again")
            try:
                self._write_new_files(batch, tasks)
                yield commit
            finally:
                if not committed:
                    self._remove_unnamed(batch.batch_id)

    def _remove_unnamed(self, batch_id: str) -> None:
        """A stage that did not commit: its files go, unless the commit's rename landed
        and only what followed it failed (an fsync of the folder)."""
        with self.locked():
            if not self.index_names(batch_id):
                self._remove_batch_files(batch_id)

    def _write_new_files(self, batch: BatchRecord, tasks: list[TaskRecord]) -> None:
        rows = [_dump(t) for t in tasks]
        beside = _BESIDE.submit(copy_context().run, self.tasks.create, batch.batch_id, rows)
        try:
            write_table(self.batches_dir / f"{batch.batch_id}.json", "batch", [_dump(batch)])
        finally:
            beside.result()

    def write_keys(self, batch: BatchRecord) -> None:
        """Write a batch's missing duplicate keys (sha256 of the bytes, batch_ref) as it
        leaves the index (`archive`): while a batch is live its index row finds its
        duplicates, so a drop does not spend two more durable writes on them."""
        for key in duplicate_keys(batch.sha256, batch.batch_ref):
            path = self.keys_dir / batch.client_id / key
            if not path.exists():  # an archive a crash cut short wrote it already
                write_atomically(path, batch.batch_id)

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
            raise NotFoundError(f"no batch {batch_id!r}")
        raise StoreError(f"{path} has no batch row")

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """Every task of the batch in file order; tasks whose files did not change since
        the last read come from memory (the caller must not change them in place)."""
        signature = self.tasks.signature(batch_id) if is_valid_id(batch_id) else None
        if signature is None:
            raise NotFoundError(f"no batch {batch_id!r}")
        with self._cache_lock:
            cached = self._cache.get(batch_id)
            if cached is not None and cached[0] == signature:
                self._cache.move_to_end(batch_id)
                return list(cached[1])
        tasks = [TaskRecord.model_validate(r) for r in self.tasks.read(batch_id)]
        self._remember(batch_id, signature, tasks)
        return list(tasks)

    def _remember(self, batch_id: str, signature: Signature, tasks: list[TaskRecord]) -> None:
        with self._cache_lock:
            self._cache[batch_id] = (signature, tasks)
            self._cache.move_to_end(batch_id)
            while sum(len(t) for _, t in self._cache.values()) > CACHED_TASKS:
                if len(self._cache) == 1:
                    break
                self._cache.popitem(last=False)

    def update_tasks(self, batch_id: str, changes: dict[str, dict[str, Any]]) -> None:
        """Record per-task field changes keyed by task_id: one appended line, whatever the
        size of the batch."""
        if not changes:
            return
        encoded = {
            task_id: {k: _encode(v) for k, v in fields.items()}
            for task_id, fields in changes.items()
        }
        with self.record_locked(batch_id):
            self.tasks.append(batch_id, encoded)

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
        """
        encoded = {k: _encode(v) for k, v in fields.items()}
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
        if not rows:
            raise NotFoundError(f"no batch {batch_id!r}")
        if when is not None and not when(current := BatchRecord.model_validate(rows[0])):
            return current
        row = {**rows[0], **encoded}
        write_table(path, "batch", [row])
        return BatchRecord.model_validate(row)

    def rewrite_row(self, batch: BatchRecord) -> None:
        """Rewrite a live batch's index row from its record (the row is a cache)."""
        with self._index_change() as data:
            _refresh_row(data, batch)

    def archive(self, batch: BatchRecord) -> None:
        """Move an emitted batch out of the index. Write order (each step idempotent, and a
        restart finishes the rest): any duplicate key it lacks, its archive rows (readers
        dedupe), then one index write that drops its row and ledger entries and counts it,
        then its files moved out of the live folders."""
        with self.locked(), crashpoints.operation("archive"):
            if any(r["batch_id"] == batch.batch_id for r in self._live_rows()):
                self._archive_row(batch)
            self._move_to_archive(batch.batch_id)

    def _archive_row(self, batch: BatchRecord) -> None:
        with self._index_change() as data:
            self._ensure_totals(data)
            self.write_keys(batch)  # the row found duplicates until now
            entries = {
                k: e for k, e in data["ledger"].items() if e.get("batch_id") == batch.batch_id
            }
            archived_at = utcnow().isoformat()  # the order of the archive file (paging.py)
            self.archive_rows.add(
                {**summary_row(batch), "archived_at": archived_at}, list(entries.values())
            )
            data["batches"] = {
                k: r for k, r in data["batches"].items() if r["batch_id"] != batch.batch_id
            }
            data["ledger"] = {k: e for k, e in data["ledger"].items() if k not in entries}
            _count(data["counts"], batch)
            tasks = self._task_statuses(batch.batch_id)
            totals.add(data["counts"]["1"], summary_row(batch), tasks, list(entries.values()))

    def snapshot(self) -> totals.Snapshot:
        """One read of the index: live batch rows, live ledger, clients, and the running
        totals of the archive (summed from the archive once if this state has none)."""
        data = AtomicJSONStorage(str(self.state_dir / "index.json")).read() or {}
        if not totals.has_totals(data.get("counts", {}).get("1", {})):
            if self.read_only:
                self._ensure_totals(_with_tables(data))
            else:
                with self._index_change() as data:
                    self._ensure_totals(data)
        return totals.Snapshot(
            live=list(data.get("batches", {}).values()),
            ledger=list(data.get("ledger", {}).values()),
            clients=list(data.get("clients", {}).values()),
            archived=totals.read(data.get("counts", {}).get("1", {})),
        )

    def _task_statuses(self, batch_id: str) -> dict[str, int]:
        """Tasks per status (usually from the cache: the last poll read them)."""
        try:
            tasks = self.get_tasks(batch_id)
        except NotFoundError:
            return {}
        return totals.task_counts({"status": str(task.status)} for task in tasks)

    def _ensure_totals(self, data: dict[str, dict[str, Any]]) -> None:
        counts_doc = data["counts"].setdefault("1", {})
        if totals.has_totals(counts_doc):
            return
        totals.backfill(
            counts_doc,
            self.archive_rows.all_batches(),
            self.tasks.read,
            self.archive_rows.all_ledger(),
            {str(r["batch_id"]) for r in data["batches"].values()},
        )

    def _move_to_archive(self, batch_id: str) -> None:
        with self.locked(), self.record_locked(batch_id):
            self.tasks.archive_to(batch_id)
            live = self.batches_dir / f"{batch_id}.json"
            if live.exists():
                target = self.archive_dir / batch_id[:6] / "batches" / live.name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(live, target)
                crashpoints.wrote(f"archived {live.name}")
        unlink_quietly(self.leases_dir / f"{batch_id}.lock")
        with self._cache_lock:
            self._cache.pop(batch_id, None)


def _refresh_row(data: dict[str, dict[str, Any]], batch: BatchRecord) -> None:
    for key, index_row in data["batches"].items():
        if index_row["batch_id"] == batch.batch_id:  # replaced, not edited (`_writable`)
            data["batches"][key] = {**index_row, **summary_row(batch)}


def _count(table: dict[str, Any], batch: BatchRecord) -> None:
    """Count an archived batch per status, for everyone and for its client."""
    doc = table.setdefault("1", {})
    for scope in ("all", f"client:{batch.client_id}"):
        per_status = doc.setdefault(scope, {})
        per_status[str(batch.status)] = per_status.get(str(batch.status), 0) + 1


def _with_tables(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    for table in ("clients", "ledger", "batches", "counts"):
        data.setdefault(table, {})
    return data
