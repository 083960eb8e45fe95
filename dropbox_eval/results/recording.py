"""VisitChanges: what one repo visit changes on its tasks, stored a page at a time.

A visit of a big batch may finish tens of thousands of tasks. Kept until the visit ends,
their change dicts (and the one journal line encoding them all) cost memory in proportion
to the batch; each page's changes are written as one journal line as soon as that page was
read instead, and only what changed stays, for the batch's progress and close: the change
itself, or, once a visit changed a quarter of a big batch's tasks (its results settling,
its close), not even that: its tasks are read again from the store when the
visit ends, after the visit let go of the ones it read, so a big batch is held as one set
of tasks, never as the tasks read, their changed copies and the store's at once.
A crash between two pages leaves the earlier pages' results stored and the batch's
counters stale, as a crash between a task write and its batch write always could: the
next visit lists from the batch's last poll again, and its counters are checked against
its tasks at each process's first visit (opentasks.py).
"""

from __future__ import annotations

import logging
from typing import Any

from ..models import TaskRecord
from ..store import Store
from .opentasks import OpenTasks, Owner

log = logging.getLogger("dropbox_eval")
# a visit that changed 1 in 4 of a big batch's tasks reads them again (a small one's
# changed copies cost less than a read)
REREAD_SHARE = 4
REREAD_TASKS = 1000


class VisitChanges:
    """The task changes of one visit: recorded page by page, applied to its task lists."""

    def __init__(self, store: Store, batch_ids: list[str], checked: set[str]) -> None:
        """`checked`: the poller's batches whose counters agree with their tasks; a batch
        leaves it with its first task write, until its counters are written again."""
        self.store = store
        self.checked = checked
        self.finished: dict[str, dict[str, None]] = {b: {} for b in batch_ids}
        self._pending: dict[str, dict[str, dict[str, Any]]] = {}
        self._updated: dict[str, dict[str, dict[str, Any]]] = {}  # task_id -> its change
        self._reread: set[str] = set()  # batches whose tasks are read again at the end

    def add(self, owner: Owner, change: dict[str, Any]) -> None:
        """One task's change, stored at the next `flush`."""
        batch, task = owner
        self._pending.setdefault(batch.batch_id, {})[task.task_id] = change
        if batch.batch_id in self._reread:
            return
        updated = self._updated.setdefault(batch.batch_id, {})
        # a second change of the same visit applies on top of the first, as the journal
        # merges its lines
        updated[task.task_id] = {**updated.get(task.task_id, {}), **change}
        if len(updated) * REREAD_SHARE >= batch.total >= REREAD_TASKS:
            self._reread.add(batch.batch_id)
            del self._updated[batch.batch_id]

    def flush(self) -> None:
        """Store the changes added since the last flush: one journal line per batch."""
        pending, self._pending = self._pending, {}
        for batch_id, changed in pending.items():
            self.checked.discard(batch_id)
            self.store.update_tasks(batch_id, changed)
            finished = self.finished.setdefault(batch_id, {})
            for task_id, change in changed.items():
                _log_change(batch_id, task_id, change)
                if "status" in change:
                    finished[task_id] = None

    def applied(self, batch_id: str, open_tasks: OpenTasks) -> list[TaskRecord] | None:
        """The batch's tasks as they are after this visit's changes were stored (None: the
        visit read none of them); they leave `open_tasks`."""
        tasks = open_tasks.release(batch_id)
        updated = self._updated.pop(batch_id, {})
        if tasks is None:
            return None
        if batch_id in self._reread:
            del tasks  # the tasks read go before the store's are read
            return self.store.get_tasks(batch_id)
        if not updated:
            return tasks
        return [
            t.model_copy(update=updated[t.task_id]) if t.task_id in updated else t for t in tasks
        ]


def _log_change(batch_id: str, task_id: str, change: dict[str, Any]) -> None:
    if "status" in change:
        log.info("batch %s: task %s finished as %s", batch_id, task_id, change["status"])
    elif change.get("settling") is None:
        log.info("batch %s: task %s reopened before settling; polled again", batch_id, task_id)
    else:
        log.debug("batch %s: task %s closed; settling", batch_id, task_id)
