"""Archiving: an emitted batch leaves the live folders and the index for one entry in the
history (history.py), and what it adds up to joins the archive's running totals
(totals.py). State folders archived before the history keep each batch's record and tasks
as two files under `archive/<YYYYMM>/`; they are read where they are."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError
from ..models import BatchRecord, TaskRecord, utcnow
from ..util import crashpoints
from ..util.fileio import write_atomically
from . import totals
from .files import AtomicJSONStorage, read_table, unlink_quietly
from .rows import duplicate_keys, summary_row

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others


class Archiving(_Base):
    """Moving emitted batches to the archive, and the totals read from the index."""

    if TYPE_CHECKING:

        def get_tasks(self, batch_id: str) -> list[TaskRecord]:
            """Every task of the batch (engine.py)."""

        def get_batch(self, batch_id: str) -> BatchRecord:
            """The batch record (engine.py)."""

        def report_file(self, batch_id: str) -> Path:
            """Where a live batch's fixed report is (reports.py)."""

    def write_keys(self, batch: BatchRecord) -> None:
        """Write a batch's missing duplicate keys (sha256 of the bytes, batch_ref) as it
        leaves the index (`archive`): while a batch is live its index row finds its
        duplicates, so a drop does not spend two more durable writes on them."""
        for key in duplicate_keys(batch.sha256, batch.batch_ref):
            path = self.keys_dir / batch.client_id / key
            if not path.exists():  # an archive a crash cut short wrote it already
                write_atomically(path, batch.batch_id)

    def archive(self, batch: BatchRecord) -> None:
        """Move an emitted batch out of the index. Write order (each step idempotent, and a
        restart finishes the rest): any duplicate key it lacks, its archive rows (readers
        dedupe), then one index write that drops its row and ledger entries and counts it,
        then its history entry (record and tasks), then its live files removed."""
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
            count_archived(data["counts"], batch)
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
            self._archived_task_docs,
            self.archive_rows.all_ledger(),
            {str(r["batch_id"]) for r in data["batches"].values()},
        )

    def _move_to_archive(self, batch_id: str) -> None:
        """The live record and tasks become one history entry (again if the entry the
        history holds is not the live record: a crash, or a change, came between), then
        the live files go."""
        with self.locked(), self.record_locked(batch_id):
            live = self.batches_dir / f"{batch_id}.json"
            rows = read_table(live, "batch")
            if rows:
                if self.history.record(batch_id) != rows[0]:
                    report = self.report_file(batch_id)  # copied a block at a time
                    tasks = self.tasks.folded(batch_id)
                    self.history.add(
                        rows[0],
                        b'{"tasks":{}}' if tasks is None else tasks,
                        report if report.exists() else None,
                    )
                base = self.tasks.live / f"{batch_id}.json"
                for path in (self.tasks.journal(base), base, self.report_file(batch_id), live):
                    unlink_quietly(path)
        unlink_quietly(self.leases_dir / f"{batch_id}.lock")
        self.parsed_tasks.forget(batch_id)

    def archived_record(self, batch_id: str) -> BatchRecord | None:
        """The record of a batch the history holds (None: not there, or buried)."""
        row = self.history.record(batch_id)
        return None if row is None else BatchRecord.model_validate(row)

    def archived_tasks(self, batch_id: str) -> list[TaskRecord] | None:
        """The tasks of a batch the history holds (None: not there, or buried)."""
        rows = self.history.tasks(batch_id)
        return None if rows is None else [TaskRecord.model_validate(row) for row in rows]

    def rewrite_archived(self, row: dict[str, Any]) -> None:
        """Replace an archived batch's record (appended again; its tasks stay)."""
        self.history.replace_record(row)

    def _archived_task_docs(self, batch_id: str) -> list[dict[str, Any]]:
        """An archived batch's tasks as stored, from the history or an older state's file."""
        found = self.history.tasks(batch_id)
        return self.tasks.read(batch_id) if found is None else found


def count_archived(table: dict[str, Any], batch: BatchRecord, by: int = 1) -> None:
    """Count an archived batch per status, for everyone and for its client (`by` -1:
    uncount a buried one)."""
    doc = table.setdefault("1", {})
    for scope in ("all", f"client:{batch.client_id}"):
        per_status = doc.setdefault(scope, {})
        left = per_status.get(str(batch.status), 0) + by
        if left > 0:
            per_status[str(batch.status)] = left
        else:
            per_status.pop(str(batch.status), None)


def _with_tables(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    for table in ("clients", "ledger", "batches", "counts"):
        data.setdefault(table, {})
    return data
