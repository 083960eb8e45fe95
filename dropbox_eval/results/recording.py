"""VisitChanges: what one repo visit changes on its tasks, stored a page at a time.

A visit of a big batch may finish tens of thousands of tasks. Kept until the visit ends,
their change dicts (and the one journal line encoding them all) cost memory in proportion
to the batch; each page's changes are written as one journal line as soon as that page was
read instead. Once stored, a task's change is the store's: the visit lets go of the task as
it read it (opentasks.py `let_go`), and a batch it changed is read again from the store when
the visit ends. So a big batch is held once, whenever the store renews its copy (a journal
compaction, another reader): never as the tasks read, their changed copies and the store's.
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


class VisitChanges:
    """The task changes of one visit: recorded page by page; the changed batches' tasks
    read again from the store at its end."""

    def __init__(self, store: Store, open_tasks: OpenTasks, checked: set[str]) -> None:
        """`checked`: the poller's batches whose counters agree with their tasks; a batch
        leaves it with its first task write, until its counters are written again."""
        self.store = store
        self.open_tasks = open_tasks
        self.checked = checked
        self.finished: dict[str, dict[str, None]] = {b: {} for b in open_tasks.batches}
        self._pending: dict[str, dict[str, dict[str, Any]]] = {}
        self._owners: list[Owner] = []  # the tasks of `_pending`, let go once it is stored
        self._changed: set[str] = set()

    def add(self, owner: Owner, change: dict[str, Any]) -> None:
        """One task's change, stored at the next `flush`."""
        batch, task = owner
        self._pending.setdefault(batch.batch_id, {})[task.task_id] = change
        self._owners.append(owner)

    def flush(self) -> None:
        """Store the changes added since the last flush: one journal line per batch."""
        pending, self._pending = self._pending, {}
        owners, self._owners = self._owners, []
        for batch_id, changed in pending.items():
            self.checked.discard(batch_id)
            self.store.update_tasks(batch_id, changed)
            self._changed.add(batch_id)
            finished = self.finished.setdefault(batch_id, {})
            for task_id, change in changed.items():
                _log_change(batch_id, task_id, change)
                if "status" in change:
                    finished[task_id] = None
        self.open_tasks.let_go(owners)

    def applied(self, batch_id: str) -> list[TaskRecord] | None:
        """The batch's tasks as they are after this visit's changes were stored (None: the
        visit read none of them); they leave the visit's `open_tasks`."""
        tasks = self.open_tasks.release(batch_id)
        if batch_id in self._changed:
            return self.store.get_tasks(batch_id)
        return tasks


def _log_change(batch_id: str, task_id: str, change: dict[str, Any]) -> None:
    if "status" in change:
        log.info("batch %s: task %s finished as %s", batch_id, task_id, change["status"])
    elif change.get("settling") is None:
        log.info("batch %s: task %s reopened before settling; polled again", batch_id, task_id)
    else:
        log.debug("batch %s: task %s closed; settling", batch_id, task_id)
