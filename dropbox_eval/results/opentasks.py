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

from collections.abc import Iterable
from dataclasses import dataclass

from ..forge.client import ForgeIssue
from ..forge.markers import read_marker
from ..models import BatchRecord, TaskRecord, TaskStatus
from ..store import Store

Owner = tuple[BatchRecord, TaskRecord]


class OpenTasks:
    """Issue number -> (batch, open task) for one visit's batches, read lazily. A task whose
    change is stored is let go (`let_go`): the store's copy is then the new one, and a
    visit that kept the old held a big batch's settling results twice."""

    def __init__(self, store: Store, batches: list[BatchRecord], checked: set[str]) -> None:
        self.store = store
        self.batches = {b.batch_id: b for b in batches}
        self.tasks: dict[str, list[TaskRecord]] = {}  # as read, until one of them changes
        self._read: dict[str, _AsRead] = {}
        self._ids: dict[str, dict[int, str]] = {}  # a let-go list's task ids by issue number
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
        if batch_id in self._read:
            return
        batch = self.batches[batch_id]
        tasks = self.store.get_tasks(batch_id)
        self.tasks[batch_id] = tasks
        counts = _AsRead()
        for task in tasks:
            if task.status == TaskStatus.OPEN and task.issue_number is not None:
                self._by_number[task.issue_number] = (batch, task)
                counts.count(task)
        self._read[batch_id] = counts

    def let_go(self, owners: Iterable[Owner]) -> None:
        """Forget these tasks, whose changes are stored, and their batches' lists (the
        visit reads a changed batch again at its end: recording.py); what `owner` asks of
        a let-go list stays: its task ids by issue number."""
        for batch, task in owners:
            self._forget(task)
            tasks = self.tasks.pop(batch.batch_id, None)
            if tasks is not None:
                self._ids[batch.batch_id] = {
                    t.issue_number: t.task_id for t in tasks if t.issue_number is not None
                }

    def release(self, batch_id: str) -> list[TaskRecord] | None:
        """Hand over one batch's tasks as read (None: not read, or let go), forgetting
        them here: the visit's last holder of the old tasks lets them go with its list."""
        tasks = self.tasks.pop(batch_id, None)
        for task in tasks or ():
            self._forget(task)
        for number in self._ids.pop(batch_id, {}):
            owner = self._by_number.get(number)
            if owner is not None and owner[0].batch_id == batch_id:
                del self._by_number[number]
        return tasks

    def _forget(self, task: TaskRecord) -> None:
        number = task.issue_number or 0
        owner = self._by_number.get(number)
        if owner is not None and owner[1] is task:
            del self._by_number[number]

    def load_all(self) -> None:
        """Read every batch's tasks: a listing of the whole repo is coming."""
        for batch_id in self.batches:
            self.load(batch_id)

    def owner(self, issue: ForgeIssue) -> Owner | None:
        """The open task this listed issue belongs to, if any."""
        found = self._by_number.get(issue.number)
        if found is not None or len(self._read) == len(self.batches):
            return found
        mark = read_marker(issue.body)
        if mark is None:  # the marker was edited away: look everywhere
            self.load_all()
        elif mark[0] in self.batches:
            self.load(mark[0])
            if not self._holds(mark[0], mark[1], issue.number):
                self.load_all()  # the marker names another issue's task: look everywhere
        return self._by_number.get(issue.number)

    def _holds(self, batch_id: str, task_id: str, number: int) -> bool:
        """Whether the batch's task `task_id` has issue `number`, as read."""
        tasks = self.tasks.get(batch_id)
        if tasks is None:
            return self._ids.get(batch_id, {}).get(number) == task_id
        return any(t.task_id == task_id and t.issue_number == number for t in tasks)

    def get(self, number: int) -> Owner | None:
        """The open task of an issue number among the batches read so far."""
        return self._by_number.get(number)

    def read(self) -> list[tuple[int, Owner]]:
        """(issue number, owner) of every open task of the batches read so far, not let go."""
        return list(self._by_number.items())

    def numbers(self) -> list[int]:
        """The issue numbers of `read`: look each owner up (`get`) when its turn comes, so
        that a list of them holds none that is let go meanwhile."""
        return list(self._by_number)

    def open(self) -> int:
        """Open tasks of every batch (read ones counted as read, the others from their
        counters)."""
        return sum(
            self._read[b.batch_id].open if b.batch_id in self._read else open_of(b)
            for b in self.batches.values()
        )

    def unsettled(self) -> int:
        """Open tasks without a result settling, as read or by their counters."""
        return sum(
            self._read[b.batch_id].unsettled if b.batch_id in self._read else unsettled_of(b)
            for b in self.batches.values()
        )

    def settling(self) -> bool:
        """Whether any task's result is settling (then the listing must show reopens)."""
        return any(b.settling_tasks > 0 for b in self.batches.values()) or any(
            read.settling for read in self._read.values()
        )


@dataclass
class _AsRead:
    """A read batch's open tasks, counted as read (its tasks may be let go since)."""

    open: int = 0
    unsettled: int = 0
    settling: bool = False

    def count(self, task: TaskRecord) -> None:
        """Count one open task."""
        self.open += 1
        self.unsettled += task.settling is None
        self.settling = self.settling or task.settling is not None


def open_of(batch: BatchRecord) -> int:
    """The batch's open tasks, by its counters."""
    return max(0, batch.total - batch.done)


def unsettled_of(batch: BatchRecord) -> int:
    """The batch's open tasks without a result settling, by its counters (a batch's
    counters are checked against its tasks at its first visit by each process)."""
    return max(0, batch.total - batch.done - batch.settling_tasks)
