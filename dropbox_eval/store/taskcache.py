"""ParsedTasks: the parsed tasks of the batches read last, kept up to date by the change.

Parsing a batch's tasks (JSON, then a model per task) costs its size; a batch being opened
records issue numbers every few seconds, and its opener, its receipt and a poll read its
tasks meanwhile. So what was parsed is kept with its position in the task files
(tasks.py): a read replays only the journal lines written since, by this process or
another, onto the kept tasks, and parses the whole batch again only when its base file
was replaced (a compaction) or the journal is not the one read before.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..models import BATCH_WIDE_TASK_FIELDS, TaskRecord
from ..util.compact import compacted
from .files import parse_line
from .tasks import Changes, Position, TaskFiles

CACHED_TASKS = 20_000  # tasks kept parsed (memory-bounded; the newest batch always stays)
READ_STRIPES = 16  # one reader per batch brings it up to date; the others wait for it
MERGED_TASKS = 2000  # a catch-up's parsed changes held before they become models


def compact_task(doc: dict[str, Any], memo: dict[Any, Any]) -> TaskRecord:
    """A stored task as a model kept by the thousand: what repeats in every task of its
    batch shared through `memo` (util/compact.py)."""
    return compacted(TaskRecord.model_validate(doc), memo, BATCH_WIDE_TASK_FIELDS)


@dataclass
class _Kept:
    position: Position
    tasks: list[TaskRecord]
    index: dict[str, int] = field(default_factory=dict)  # task_id -> place in `tasks`
    memo: dict[Any, Any] = field(default_factory=dict)  # the batch's shared values

    def apply(self, changes: Iterable[Changes]) -> None:
        """Replace the changed tasks by new models (the lists handed out keep theirs). The
        lines are merged per task as they are parsed, and the merged changes become models
        every MERGED_TASKS tasks: a big catch-up (a whole batch's results) holds a few
        thousand parsed changes, not one per task of the batch."""
        merged: dict[str, dict[str, Any]] = {}
        for change in changes:
            for task_id, fields in change.items():
                if task_id in self.index:
                    known = merged.get(task_id)
                    if known is None:
                        merged[task_id] = fields  # the parsed line's own dict: no copy
                    else:
                        known.update(fields)
            if len(merged) >= MERGED_TASKS:  # each line sets absolute values: a later
                self._renew(merged)  # line of the same task makes its model again
        self._renew(merged)

    def _renew(self, merged: dict[str, dict[str, Any]]) -> None:
        """New models of the tasks in `merged`, which it empties."""
        while merged:
            task_id, fields = merged.popitem()
            place = self.index[task_id]
            # its unchanged values as they are (models are not validated again): the
            # old and the new task share them while a caller still holds the old one
            changed = {**self.tasks[place].__dict__, **fields}
            self.tasks[place] = compact_task(changed, self.memo)


class ParsedTasks:
    """Parsed tasks per batch, least recently read dropped first. Thread-safe."""

    def __init__(self, files: TaskFiles, limit: int = CACHED_TASKS) -> None:
        self.files = files
        self.limit = limit
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._count = 0  # tasks kept in all: summed on every keep, it was quadratic
        self._lock = threading.Lock()
        self._readers = [threading.Lock() for _ in range(READ_STRIPES)]

    def get(self, batch_id: str) -> list[TaskRecord] | None:
        """The batch's tasks as they are now, in file order (a new list, whose tasks the
        caller must not change in place); None when it has no tasks file."""
        with self._reader(batch_id):
            with self._lock:
                kept = self._kept.get(batch_id)
            if kept is not None:
                if self._catch_up(kept, batch_id):
                    self._keep(batch_id, kept)
                    return list(kept.tasks)
                self.forget(batch_id)  # not two parsed copies of a big batch at once
            return self._parse(batch_id)

    def seed(self, batch_id: str, tasks: list[TaskRecord]) -> None:
        """Keep a new batch's tasks as just written to its base file (nothing appended to
        it yet): its first readers need not parse what its intake had as models."""
        base = self.files.identity(batch_id)
        if base is not None:
            index = {task.task_id: place for place, task in enumerate(tasks)}
            self._keep(batch_id, _Kept(Position(base), list(tasks), index))

    def append(self, batch_id: str, changes: Changes) -> None:
        """Journal `changes` (tasks.py `append`); a kept batch read up to just before the
        line takes it as written, not read back: its readers, and the visit that wrote it,
        then find it caught up. The caller holds the record lock."""
        appended = self.files.append(batch_id, changes)
        if appended is None:
            return
        with self._reader(batch_id):
            with self._lock:
                kept = self._kept.get(batch_id)
            if kept is not None and appended.follows(kept.position):
                kept.apply([parse_line(appended.line) or {}])  # as every other reader sees it
                kept.position = appended.after

    def compact(self, batch_id: str) -> None:
        """Fold the batch's journal into its base (tasks.py `compact`), from the tasks kept
        here when they can be brought to the journal's end: written from the models, not
        parsed again, and kept as the new base's. The caller holds the record lock, so
        nothing is appended meanwhile."""
        with self._reader(batch_id):
            with self._lock:
                kept = self._kept.get(batch_id)
            if kept is not None and self._catch_up(kept, batch_id):
                base = self.files.replace_base(batch_id, kept.tasks)
                if base is not None:
                    kept.position = Position(base)
                    return
            self.forget(batch_id)
        self.files.compact(batch_id)

    def _catch_up(self, kept: _Kept, batch_id: str) -> bool:
        """Apply the journal lines written since `kept` was read; False when its base is
        no longer the file's (compacted elsewhere, or gone): it must be parsed again."""
        found = self.files.changes_after(batch_id, kept.position)
        if found is None:
            return False
        kept.apply(found[0])
        kept.position = found[1]
        return True

    def _parse(self, batch_id: str) -> list[TaskRecord] | None:
        read = self.files.read_at(batch_id)
        if read is None:
            self.forget(batch_id)
            return None
        docs, position = read
        memo: dict[Any, Any] = {}
        docs.reverse()  # each task's parsed JSON goes as its model is made
        tasks = [compact_task(docs.pop(), memo) for _ in range(len(docs))]
        index = {task.task_id: place for place, task in enumerate(tasks)}
        self._keep(batch_id, _Kept(position, tasks, index, memo))
        return list(tasks)

    def _keep(self, batch_id: str, kept: _Kept) -> None:
        with self._lock:
            self._drop(batch_id)
            self._kept[batch_id] = kept
            self._count += len(kept.tasks)
            while len(self._kept) > 1 and self._count > self.limit:
                self._drop(next(iter(self._kept)))

    def _reader(self, batch_id: str) -> threading.Lock:
        """The batch's reader stripe: one reader per batch brings it up to date."""
        return self._readers[zlib.crc32(batch_id.encode()) % READ_STRIPES]

    def forget(self, batch_id: str) -> None:
        """Drop a batch's tasks (it left the live folders)."""
        with self._lock:
            self._drop(batch_id)

    def _drop(self, batch_id: str) -> None:
        """Forget one batch's tasks; the caller holds the lock."""
        gone = self._kept.pop(batch_id, None)
        if gone is not None:
            self._count -= len(gone.tasks)
