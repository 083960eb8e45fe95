"""A batch's tasks: a base file written once, plus a journal of changes.

Intake flushes and poll cycles append only the tasks that changed (one JSON line per write,
fsynced), so a write costs the change, not the batch's size. Reading replays the journal
over the base; when the journal outgrows the base it is folded in (compaction). Replaying a
journal over a base that already holds it gives the same tasks (each line sets absolute
field values), so a crash in the middle of a compaction loses nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..util import crashpoints
from .files import append_lines, read_lines, read_table, unlink_quietly, write_table

Changes = dict[str, dict[str, Any]]
Signature = tuple[int, int, int, int, int, int]
TABLE = "tasks"
MIN_COMPACT_BYTES = 64 * 1024


class TaskFiles:
    """The task files of every batch, live or archived."""

    def __init__(self, live: Path, archive: Path) -> None:
        self.live = live
        self.archive = archive

    def base(self, batch_id: str) -> Path:
        """The base file: in `tasks/` while live, under `archive/<YYYYMM>/tasks/` after."""
        live = self.live / f"{batch_id}.json"
        if live.exists():
            return live
        archived = self.archive / batch_id[:6] / "tasks" / f"{batch_id}.json"
        return archived if archived.exists() else live

    @staticmethod
    def journal(base: Path) -> Path:
        """The journal beside a base file."""
        return base.with_suffix(".journal")

    def create(self, batch_id: str, docs: list[dict[str, Any]]) -> None:
        """Write a new batch's tasks (one write for all)."""
        write_table(self.live / f"{batch_id}.json", TABLE, docs)

    def signature(self, batch_id: str) -> Signature | None:
        """What changes whenever the tasks do (for caches); None when there are none."""
        base = self.base(batch_id)
        try:
            first = os.stat(base)
        except FileNotFoundError:
            return None
        try:
            second = os.stat(self.journal(base))
            extra = (second.st_ino, second.st_size, second.st_mtime_ns)
        except FileNotFoundError:
            extra = (0, 0, 0)
        return (first.st_ino, first.st_size, first.st_mtime_ns, *extra)

    def read(self, batch_id: str) -> list[dict[str, Any]]:
        """The tasks as they are now: the base with the journal replayed."""
        base = self.base(batch_id)
        docs = read_table(base, TABLE)
        changes = read_lines(self.journal(base))
        if changes:
            by_id = {doc["task_id"]: doc for doc in docs}
            for change in changes:
                for task_id, fields in change.items():
                    if task_id in by_id:
                        by_id[task_id].update(fields)
        return docs

    def append(self, batch_id: str, changes: Changes) -> None:
        """Journal the changed tasks; fold the journal in once it outgrows the base.
        The caller holds the batch's record lock."""
        base = self.base(batch_id)
        journal = self.journal(base)
        append_lines(journal, [changes])
        if journal.stat().st_size > max(base.stat().st_size, MIN_COMPACT_BYTES):
            self.compact(batch_id)

    def compact(self, batch_id: str) -> Path:
        """Fold the journal into the base; returns the base. The caller holds the record lock."""
        base = self.base(batch_id)
        journal = self.journal(base)
        if journal.exists():
            write_table(base, TABLE, self.read(batch_id))
            unlink_quietly(journal)
        return base

    def archive_to(self, batch_id: str) -> None:
        """Move a finished batch's tasks out of `tasks/`, folded into one file."""
        live = self.live / f"{batch_id}.json"
        if not live.exists():
            return
        self.compact(batch_id)
        target = self.archive / batch_id[:6] / "tasks" / live.name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(live, target)
        crashpoints.wrote(f"archived {live.name}")
