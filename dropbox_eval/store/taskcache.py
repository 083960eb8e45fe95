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
from dataclasses import dataclass, field
from typing import Any

from ..models import TaskRecord
from .tasks import Changes, Position, TaskFiles

CACHED_TASKS = 20_000  # tasks kept parsed (memory-bounded; the newest batch always stays)
READ_STRIPES = 16  # one reader per batch brings it up to date; the others wait for it


@dataclass
class _Kept:
    position: Position
    tasks: list[TaskRecord]
    index: dict[str, int] = field(default_factory=dict)  # task_id -> place in `tasks`

    def apply(self, changes: list[Changes]) -> None:
        """Replace the changed tasks by new models (the lists handed out keep theirs)."""
        merged: dict[str, dict[str, Any]] = {}
        for change in changes:
            for task_id, fields in change.items():
                if task_id in self.index:
                    merged.setdefault(task_id, {}).update(fields)
        for task_id, fields in merged.items():
            place = self.index[task_id]
            self.tasks[place] = TaskRecord.model_validate(
                {**self.tasks[place].model_dump(), **fields}
            )


class ParsedTasks:
    """Parsed tasks per batch, least recently read dropped first. Thread-safe."""

    def __init__(self, files: TaskFiles, limit: int = CACHED_TASKS) -> None:
        self.files = files
        self.limit = limit
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._lock = threading.Lock()
        self._readers = [threading.Lock() for _ in range(READ_STRIPES)]

    def get(self, batch_id: str) -> list[TaskRecord] | None:
        """The batch's tasks as they are now, in file order (a new list, whose tasks the
        caller must not change in place); None when it has no tasks file."""
        with self._readers[zlib.crc32(batch_id.encode()) % READ_STRIPES]:
            with self._lock:
                kept = self._kept.get(batch_id)
            if kept is not None:
                found = self.files.changes_after(batch_id, kept.position)
                if found is not None:
                    kept.apply(found[0])
                    kept.position = found[1]
                    self._keep(batch_id, kept)
                    return list(kept.tasks)
            return self._parse(batch_id)

    def _parse(self, batch_id: str) -> list[TaskRecord] | None:
        read = self.files.read_at(batch_id)
        if read is None:
            self.forget(batch_id)
            return None
        docs, position = read
        tasks = [TaskRecord.model_validate(doc) for doc in docs]
        index = {task.task_id: place for place, task in enumerate(tasks)}
        self._keep(batch_id, _Kept(position, tasks, index))
        return list(tasks)

    def _keep(self, batch_id: str, kept: _Kept) -> None:
        with self._lock:
            self._kept[batch_id] = kept
            self._kept.move_to_end(batch_id)
            while len(self._kept) > 1 and sum(len(k.tasks) for k in self._kept.values()) > (
                self.limit
            ):
                self._kept.popitem(last=False)

    def forget(self, batch_id: str) -> None:
        """Drop a batch's tasks (it left the live folders)."""
        with self._lock:
            self._kept.pop(batch_id, None)
