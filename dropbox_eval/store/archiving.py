"""Archiving: an emitted batch leaves the live folders and the index, and what it adds up
to joins the archive's running totals (totals.py)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError
from ..models import BatchRecord, TaskRecord, utcnow
from ..util import crashpoints
from ..util.fileio import write_atomically
from . import totals
from .files import AtomicJSONStorage, unlink_quietly
from .listing import duplicate_keys
from .rows import summary_row

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others


class Archiving(_Base):
    """Moving emitted batches to the archive, and the totals read from the index."""

    if TYPE_CHECKING:

        def get_tasks(self, batch_id: str) -> list[TaskRecord]:
            """Every task of the batch (engine.py)."""

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
        self.parsed_tasks.forget(batch_id)


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
