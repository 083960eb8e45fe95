"""OpenTasks: one repo visit's open tasks, read only for the batches a listing touches.

A poll that lists few changes should not read every task of every batch in the repo: with
a shared repo that is every task in flight, on every cycle. Each issue the service opened
ends with a marker naming its batch, so a listed issue says which batch's tasks to read;
an idle listing reads none. Some batches are read at once: those whose counters this
process has not yet checked against their tasks (a crash between the task write and the
batch write can leave `done` or `settling_tasks` stale), those with results settling (a
settling task finishes when the listing does *not* show it), those with nothing left open
(the visit settles them), and every batch when the whole repo is listed.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..forge.client import ForgeIssue
from ..forge.markers import read_marker
from ..models import BatchRecord, TaskRecord, TaskStatus
from ..store import Store

Owner = tuple[BatchRecord, TaskRecord]


class OpenTasks:
    """Issue number -> (batch, open task) for one visit's batches, read lazily."""

    def __init__(self, store: Store, batches: list[BatchRecord], checked: set[str]) -> None:
        self.store = store
        self.batches = {b.batch_id: b for b in batches}
        self.tasks: dict[str, list[TaskRecord]] = {}
        self._by_number: dict[int, Owner] = {}
        for batch in batches:
            if (
                batch.batch_id not in checked
                or batch.settling_tasks > 0
                or batch.done >= batch.total
                or not batch.intake_done
            ):
                self.load(batch.batch_id)

    def load(self, batch_id: str) -> None:
        """Read one batch's tasks (once per visit)."""
        if batch_id in self.tasks:
            return
        batch = self.batches[batch_id]
        tasks = self.store.get_tasks(batch_id)
        self.tasks[batch_id] = tasks
        for task in tasks:
            if task.status == TaskStatus.OPEN and task.issue_number is not None:
                self._by_number[task.issue_number] = (batch, task)

    def release(self, batch_id: str) -> list[TaskRecord] | None:
        """Hand over one batch's tasks as read (None: not read), forgetting them here: the
        visit's last holder of the old tasks lets them go with its list."""
        tasks = self.tasks.pop(batch_id, None)
        if tasks is not None:
            for task in tasks:
                owner = self._by_number.get(task.issue_number or 0)
                if owner is not None and owner[1] is task:
                    del self._by_number[task.issue_number or 0]
        return tasks

    def load_all(self) -> None:
        """Read every batch's tasks: a listing of the whole repo is coming."""
        for batch_id in self.batches:
            self.load(batch_id)

    def owner(self, issue: ForgeIssue) -> Owner | None:
        """The open task this listed issue belongs to, if any."""
        found = self._by_number.get(issue.number)
        if found is not None or len(self.tasks) == len(self.batches):
            return found
        mark = read_marker(issue.body)
        if mark is None:  # the marker was edited away: look everywhere
            self.load_all()
        elif mark[0] in self.batches:
            self.load(mark[0])
            if not any(
                t.task_id == mark[1] and t.issue_number == issue.number for t in self.tasks[mark[0]]
            ):
                self.load_all()  # the marker names another issue's task: look everywhere
        return self._by_number.get(issue.number)

    def get(self, number: int) -> Owner | None:
        """The open task of an issue number among the batches read so far."""
        return self._by_number.get(number)

    def read(self) -> list[tuple[int, Owner]]:
        """(issue number, owner) of every open task of the batches read so far."""
        return list(self._by_number.items())

    def open(self) -> int:
        """Open tasks of every batch (read ones counted, the others from their counters)."""
        return sum(
            sum(1 for _ in self._open_of(b.batch_id)) if b.batch_id in self.tasks else open_of(b)
            for b in self.batches.values()
        )

    def unsettled(self) -> int:
        """Open tasks without a result settling."""
        return sum(
            sum(1 for t in self._open_of(b.batch_id) if t.settling is None)
            if b.batch_id in self.tasks
            else unsettled_of(b)
            for b in self.batches.values()
        )

    def settling(self) -> bool:
        """Whether any task's result is settling (then the listing must show reopens)."""
        return any(b.settling_tasks > 0 for b in self.batches.values()) or any(
            task.settling is not None for _, task in self._by_number.values()
        )

    def _open_of(self, batch_id: str) -> Iterator[TaskRecord]:
        for task in self.tasks[batch_id]:
            if task.status == TaskStatus.OPEN and task.issue_number is not None:
                yield task


def open_of(batch: BatchRecord) -> int:
    """The batch's open tasks, by its counters."""
    return max(0, batch.total - batch.done)


def unsettled_of(batch: BatchRecord) -> int:
    """The batch's open tasks without a result settling, by its counters (a batch's
    counters are checked against its tasks at its first visit by each process)."""
    return max(0, batch.total - batch.done - batch.settling_tasks)
