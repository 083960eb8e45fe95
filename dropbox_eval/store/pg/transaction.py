"""The PostgreSQL engine's transaction: one database transaction on one connection. Its
changes are made as they come (so its reads see them) and land together at COMMIT, none
of them if the block raises. The writes it made are counted for the crash-point walk once
they have landed, as one durable write (one COMMIT), in the contexts they were made in."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, SupportsBytes

from ...models import BatchRecord, Client, LedgerEntry, TaskRecord
from ...util import crashpoints
from ..contract import TaskChanges
from . import reads, writes
from .connection import Connection, ConnectionLost, DatabaseError


class PgTransaction:
    """A transaction of `PostgresStore` (the contract's `Transaction`)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._written: list[tuple[contextvars.Context, str]] = []
        self._after: list[Callable[[], None]] = []

    def _wrote(self, what: str) -> None:
        self._written.append((contextvars.copy_context(), what))

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record with this transaction's changes."""
        return reads.get_batch(self.conn, batch_id)

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """The tasks with this transaction's changes."""
        return reads.get_tasks(self.conn, batch_id)

    def record_batch(
        self, batch: BatchRecord, tasks: list[TaskRecord], hold: LedgerEntry | None
    ) -> None:
        """A new batch, its tasks and its hold."""
        writes.insert_batch(self.conn, batch, tasks)
        self._wrote("batches")
        if hold is not None:
            self.post_ledger(hold)

    def update_batch(
        self, batch_id: str, *, settlement: list[LedgerEntry] | None = None, **fields: Any
    ) -> BatchRecord:
        """Batch fields changed (its settlement posted once); the record as it will be."""
        return self.change_batch(batch_id, settlement=settlement, fields=fields)

    def change_batch(
        self,
        batch_id: str,
        *,
        fields: dict[str, Any],
        settlement: list[LedgerEntry] | None = None,
        when: Callable[[BatchRecord], bool] | None = None,
    ) -> BatchRecord:
        """`update_batch` with its `when`: an emitted batch is archived in the same
        transaction."""
        report = fields.pop("report", None)
        if report is not None and not isinstance(report, bytes):  # its pieces: one value
            report = bytes(report) if isinstance(report, SupportsBytes) else b"".join(report)
        batch, changed = writes.change_batch(self.conn, batch_id, fields, when)
        if not changed:
            return batch
        if report is not None:  # in the same transaction as the record it belongs to
            self.conn.execute(
                "UPDATE batches SET report = %s WHERE batch_id = %s", (report, batch_id)
            )
        self._wrote("batches")
        if settlement:
            self.settle(settlement)
        if batch.emitted_at is not None:
            self.archive(batch_id)
        return batch

    def update_tasks(self, batch_id: str, changes: TaskChanges) -> None:
        """Fields of the batch's tasks changed."""
        if changes:
            writes.change_tasks(self.conn, batch_id, changes)
            self._wrote("tasks")

    def add_client(self, client: Client) -> None:
        """A new client."""
        writes.add_client(self.conn, client)
        self._wrote("clients")

    def update_client(self, client_id: str, **fields: Any) -> None:
        """Client fields other than money changed."""
        writes.change_client(self.conn, client_id, fields)
        self._wrote("clients")

    def post_ledger(self, entry: LedgerEntry) -> None:
        """A ledger entry posted: the client's balance and held credits move by it."""
        writes.post_entry(self.conn, entry)
        self._wrote("ledger")

    def settle(self, entries: list[LedgerEntry]) -> bool:
        """A batch's settlement posted once; False when it was posted already."""
        posted = writes.settle(self.conn, entries)
        if posted:
            self._wrote("ledger")
        return posted

    def archive(self, batch_id: str) -> None:
        """A live batch moved to the history (nothing when it is not live)."""
        if writes.archive(self.conn, batch_id):
            self._wrote("batches")

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the changes have landed."""
        self._after.append(action)

    def landed(self) -> None:
        """The transaction committed: its writes count for the crash-point walk, once."""
        written, self._written = self._written, []
        crashpoints.landed_together((context, f"pg:{what}") for context, what in written)

    def run_after(self) -> None:
        """The actions waiting for the commit. One that meets a lost connection raises a
        plain DatabaseError: the transaction landed, it is not one to run again (rerun.py)."""
        after, self._after = self._after, []
        for action in after:
            try:
                action()
            except ConnectionLost as exc:
                raise DatabaseError(str(exc)) from exc
