"""The TinyDB engine's transaction: the store lock held over the block, its changes kept
until the block ends, then written in the order they were made (each in the context it was
made in, so the crash-point walk counts it toward the operation open around it), with the
engine's safe write order inside each change. A block that raises writes nothing."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..models import BatchRecord, Client, LedgerEntry, TaskRecord
from .contract import TaskChanges

if TYPE_CHECKING:
    from .engine import TinyDBStore


class PendingChanges:
    """A transaction of `TinyDBStore`: its changes, applied at `commit`."""

    def __init__(self, store: TinyDBStore) -> None:
        self.store = store
        self.ready: dict[str, Callable[[LedgerEntry | None], None]] = {}  # staged: commit
        self._steps: list[tuple[contextvars.Context, Callable[[], object]]] = []
        self._after: list[Callable[[], None]] = []
        self._batches: dict[str, dict[str, Any]] = {}  # batch_id -> changed fields
        self._tasks: dict[str, list[TaskChanges]] = {}
        self._new: dict[str, tuple[BatchRecord, list[TaskRecord]]] = {}

    def _later(self, step: Callable[[], object]) -> None:
        self._steps.append((contextvars.copy_context(), step))

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The record with this transaction's changes."""
        new = self._new.get(batch_id)
        batch = new[0] if new else self.store.get_batch(batch_id)
        changed = self._batches.get(batch_id)
        if not changed:
            return batch
        return BatchRecord.model_validate({**batch.model_dump(), **changed})

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """The tasks with this transaction's changes."""
        new = self._new.get(batch_id)
        tasks = list(new[1]) if new else self.store.get_tasks(batch_id)
        for changes in self._tasks.get(batch_id, []):
            tasks = [
                TaskRecord.model_validate({**t.model_dump(), **changes[t.task_id]})
                if t.task_id in changes
                else t
                for t in tasks
            ]
        return tasks

    def record_batch(
        self, batch: BatchRecord, tasks: list[TaskRecord], hold: LedgerEntry | None
    ) -> None:
        """Record a new batch, its tasks and its hold."""
        self._new[batch.batch_id] = (batch, tasks)
        ready = self.ready.get(batch.batch_id)
        self._later(lambda: self.store.commit_batch(batch, tasks, hold, ready))

    def update_batch(
        self, batch_id: str, *, settlement: list[LedgerEntry] | None = None, **fields: Any
    ) -> BatchRecord:
        """Change batch fields (and post its settlement); the record as it will be."""
        after = self.get_batch(batch_id)
        self._batches.setdefault(batch_id, {}).update(fields)
        self._later(lambda: self.store.update_batch(batch_id, settlement=settlement, **fields))
        return BatchRecord.model_validate({**after.model_dump(), **fields})

    def update_tasks(self, batch_id: str, changes: TaskChanges) -> None:
        """Change fields of the batch's tasks."""
        if changes:
            self._tasks.setdefault(batch_id, []).append(changes)
            self._later(lambda: self.store.update_tasks(batch_id, changes))

    def add_client(self, client: Client) -> None:
        """Create a client."""
        self._later(lambda: self.store.add_client(client))

    def update_client(self, client_id: str, **fields: Any) -> None:
        """Change client fields other than money."""
        self._later(lambda: self.store.update_client(client_id, **fields))

    def post_ledger(self, entry: LedgerEntry) -> None:
        """Post a ledger entry."""
        self._later(lambda: self.store.post_ledger(entry))

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the changes have landed."""
        self._after.append(action)

    def commit(self) -> None:
        """Write the changes in the order made; the caller holds the store lock."""
        steps, self._steps = self._steps, []
        for context, step in steps:
            context.run(step)

    def run_after(self) -> None:
        """The actions waiting for the commit (the caller released the lock)."""
        after, self._after = self._after, []
        for action in after:
            action()
