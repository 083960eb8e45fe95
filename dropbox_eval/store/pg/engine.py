"""`PostgresStore`: the store contract (contract.py) on a PostgreSQL database.

A transaction is a database transaction that first takes the store lock (a transaction
advisory lock), so a read-check-write excludes every other one in any process or node,
as the TinyDB engine's store lock does. A single change (a batch's fields, its tasks, an
audit line) is its own short transaction without that lock: row locks are enough. A
change made while this thread has a transaction open joins it. Reads see what has
landed, on a pool of their own: a crowd waiting for the store lock never starves them.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ...models import BatchRecord, BatchStatus, Client, LedgerEntry, TaskRecord
from ..audit import AuditEntry
from ..contract import TaskChanges
from ..rows import BatchRow, HistoryPage
from ..secrecy import private_folder
from ..totals import Snapshot
from . import listing, reads, writes
from .claims import Claims
from .connection import LOCK_SPACE, STORE_LOCK, Connection, committing, database_errors, open_pool
from .migrate import check_schema, migrate
from .rerun import rerunning
from .sharing import Sharing
from .transaction import PgTransaction


@rerunning  # a read or a whole transaction of its own, cut by a lost connection: again
class PostgresStore(Sharing):
    """The store contract on the database at `url`; other parts keep their own files in
    `state_dir` (this node's). Safe across threads, processes and nodes."""

    def __init__(self, url: str, state_dir: Path, *, read_only: bool = False) -> None:
        """Migrates the schema first (behind its lock) unless `read_only`, which changes
        nothing and raises NoState when the schema was never created."""
        self.url = url
        self._state_dir = state_dir
        if read_only:
            check_schema(url)
        else:
            private_folder(state_dir)
            migrate(url)
        self._pool = open_pool(url)  # reads, single changes, claims, nodes
        self._tx_pool = open_pool(url)  # transactions (which may wait for the store lock)
        self._local = threading.local()
        self._claims = Claims()

    @property
    def state_dir(self) -> Path:
        """This node's state folder (service status, pause, SFTP's own files)."""
        return self._state_dir

    def close(self) -> None:
        """Close the pool's connections."""
        self._pool.close()
        self._tx_pool.close()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        with database_errors(self.url), self._pool.connection() as conn:
            yield conn

    @contextlib.contextmanager
    def _writing(self, *, locked: bool) -> Iterator[PgTransaction]:
        """The transaction open in this thread, or a new one (holding the store lock if
        `locked`) that commits as the block ends and rolls back if it raises."""
        joined: PgTransaction | None = getattr(self._local, "tx", None)
        if joined is not None:
            yield joined
            return
        self._claims.verify()  # a claim lost with its connection stops its holder here
        with database_errors(self.url), self._tx_pool.connection() as conn:
            tx = PgTransaction(conn)
            with committing(self.url) as sent, conn.transaction():
                if locked:
                    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_SPACE, STORE_LOCK))
                self._local.tx = tx
                try:
                    yield tx
                finally:
                    self._local.tx = None
                sent()  # the COMMIT goes next: a connection lost from here leaves it unknown
        tx.landed()
        tx.run_after()

    def transaction(
        self, *, preparing: tuple[BatchRecord, list[TaskRecord]] | None = None
    ) -> contextlib.AbstractContextManager[PgTransaction]:
        """The store lock over the block, its changes landing at its end (contract.py).
        `preparing` needs nothing written ahead here: a COMMIT records a batch whole."""
        return self._writing(locked=True)

    def arriving(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to wait for: concurrent commits share their WAL flush by themselves."""
        return contextlib.nullcontext()

    def commit_new(
        self,
        batch: BatchRecord,
        tasks: list[TaskRecord],
        decide: Callable[[], LedgerEntry | None],
    ) -> None:
        """Record a new batch, its tasks and the hold `decide` returns (run under the
        store lock), in one transaction."""
        with self.transaction() as tx:
            tx.record_batch(batch, tasks, decide())

    # -- batches ----------------------------------------------------------------------

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record; NotFoundError when unknown."""
        with self._reading() as conn:
            return reads.get_batch(conn, batch_id)

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """Every task of the batch, in order."""
        with self._reading() as conn:
            return reads.get_tasks(conn, batch_id)

    def issue_numbers(self, batch_id: str) -> dict[str, int | None]:
        """task_id -> the issue number recorded so far, in task order."""
        with self._reading() as conn:
            return reads.issue_numbers(conn, batch_id)

    def get_report(self, batch_id: str) -> bytes | None:
        """The report fixed at the batch's close (`update_batch(report=...)`); None before."""
        with self._reading() as conn:
            return reads.get_report(conn, batch_id)

    def open_report(self, batch_id: str) -> BinaryIO | None:
        """The fixed report as a file to read (one value of its row, read whole)."""
        found = self.get_report(batch_id)
        return None if found is None else io.BytesIO(found)

    def update_batch(
        self,
        batch_id: str,
        *,
        settlement: list[LedgerEntry] | None = None,
        when: Callable[[BatchRecord], bool] | None = None,
        **fields: Any,
    ) -> BatchRecord:
        """Change batch fields unless `when` refuses the record as read; the store lock is
        taken when money moves or the batch leaves for the history."""
        locked = bool(settlement) or "emitted_at" in fields
        with self._writing(locked=locked) as tx:
            return tx.change_batch(batch_id, fields=fields, settlement=settlement, when=when)

    def update_tasks(self, batch_id: str, changes: TaskChanges) -> None:
        """Change fields of the batch's tasks."""
        if changes:
            with self._writing(locked=False) as tx:
                tx.update_tasks(batch_id, changes)

    def archive(self, batch: BatchRecord) -> None:
        """Move an emitted batch out of the live batches (again: nothing)."""
        with self._writing(locked=True) as tx:
            tx.archive(batch.batch_id)

    def claim_issues(
        self, batch_id: str, wait: float = 0.0
    ) -> contextlib.AbstractContextManager[bool]:
        """A session advisory lock on the batch, held on a connection of its own (claims.py)."""
        return self._claims.hold(self._reading(), batch_id, wait)

    def is_recorded(self, batch_id: str) -> bool:
        """Whether the batch was recorded (live, archived or buried)."""
        with self._reading() as conn:
            found = conn.execute("SELECT 1 FROM batches WHERE batch_id = %s", (batch_id,))
            return found.fetchone() is not None

    def find_batch(
        self, client_id: str, *, sha256: str | None = None, batch_ref: str | None = None
    ) -> str | None:
        """The id of an earlier batch of this client with the same bytes or batch_ref."""
        with self._reading() as conn:
            return listing.find_batch(conn, client_id, sha256, batch_ref)

    def list_batches(
        self,
        *,
        live_only: bool = False,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        batch_id: str | None = None,
        repo: str | None = None,
    ) -> list[BatchRow]:
        """Rows matching every filter given, oldest first."""
        with self._reading() as conn:
            return listing.list_batches(
                conn,
                live_only=live_only,
                client_id=client_id,
                status=status,
                batch_id=batch_id,
                repo=repo,
            )

    def page_batches(
        self,
        *,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        limit: int = 50,
        offset: int = 0,
        finished: bool = False,
        matches: int | None = None,
        after: str | None = None,
    ) -> list[BatchRow]:
        """One page of rows, live first (contract.py); `matches` is not needed here."""
        with self._reading() as conn:
            return listing.page_batches(
                conn,
                client_id=client_id,
                status=status,
                limit=limit,
                offset=offset,
                finished=finished,
                after=after,
            )

    def history_page(
        self,
        *,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> HistoryPage:
        """Archived batches newest archived first, from `cursor`."""
        if cursor is not None:
            listing.decode_cursor(cursor)  # ValueError before any connection is taken
        with self._reading() as conn:
            return listing.history_page(
                conn, client_id=client_id, status=status, limit=limit, cursor=cursor
            )

    def bury_batch(self, batch_id: str, *, reason: str, keep: dict[str, Any] | None = None) -> bool:
        """Replace an archived batch by its tombstone; False when not archived."""
        with self._writing(locked=True) as tx:
            return writes.bury(tx.conn, batch_id, reason, keep)

    def count_batches(self, client_id: str | None = None) -> dict[str, int]:
        """Batches per status, live and archived."""
        with self._reading() as conn:
            return listing.count_batches(conn, client_id)

    def live_repos(self) -> set[str]:
        """The repos (case-folded) of batches not yet archived."""
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT DISTINCT repo_folded FROM batches WHERE archived_at IS NULL"
            ).fetchall()
        return {str(row["repo_folded"]) for row in rows}

    def tombstone(self, batch_id: str) -> dict[str, Any] | None:
        """The tombstone of a buried or erased batch; None otherwise."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT tombstone FROM batches WHERE batch_id = %s", (batch_id,)
            ).fetchone()
        return None if row is None else row["tombstone"]

    def erase_batch(self, batch: BatchRecord, tombstone: dict[str, Any]) -> None:
        """Archive (if live), bury with `tombstone`, drop the duplicate keys: at once."""
        with self._writing(locked=True) as tx:
            tx.archive(batch.batch_id)
            reason = str(tombstone.get("deleted_by", "deleted"))
            writes.bury(tx.conn, batch.batch_id, reason, tombstone)
            writes.forget_keys(tx.conn, batch.batch_id)

    def snapshot(self) -> Snapshot:
        """Live rows, the live ledger, clients and the archive's totals, in one read."""
        with self._reading() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return listing.snapshot(conn)

    # -- clients and money ------------------------------------------------------------

    def get_client(self, client_id: str) -> Client | None:
        """The client, or None when unknown."""
        with self._reading() as conn:
            return reads.get_client(conn, client_id)

    def list_clients(self) -> list[Client]:
        """Every client, sorted by id."""
        with self._reading() as conn:
            return reads.list_clients(conn)

    def ledger(self, client_id: str, limit: int | None = None) -> list[LedgerEntry]:
        """The client's newest `limit` ledger entries, oldest first."""
        with self._reading() as conn:
            return reads.ledger(conn, client_id, limit)

    def settle(self, entries: list[LedgerEntry]) -> bool:
        """Post a batch's settlement once; False if it was settled already."""
        with self._writing(locked=True) as tx:
            return tx.settle(entries)

    # -- the audit log ----------------------------------------------------------------

    def record_action(
        self,
        action: str,
        target: str,
        *,
        actor: str,
        via: str,
        result: str = "ok",
        key_id: str | None = None,
        **detail: Any,
    ) -> None:
        """Append one operator action to the audit log."""
        entry = AuditEntry.now(
            action, target, actor=actor, via=via, result=result, key_id=key_id, **detail
        )
        with self._reading() as conn:
            writes.add_action(conn, entry)

    def audit_entries(self, limit: int | None = None) -> list[AuditEntry]:
        """The newest `limit` operator actions, oldest first."""
        with self._reading() as conn:
            return reads.audit_entries(conn, limit)

    # -- the state check --------------------------------------------------------------

    def stored_batch_ids(self) -> list[str]:
        """The live batches: a COMMIT records a batch whole, so none is half-recorded."""
        return [row.batch_id for row in self.list_batches(live_only=True)]

    def being_recorded(self, batch_id: str) -> bool:
        """Never seen: an uncommitted batch is invisible to every other session."""
        return False

    def drop_unrecorded(self, batch_id: str) -> bool:
        """Nothing to drop: a recording cut short leaves nothing in the database."""
        return False

    def refresh_row(self, batch: BatchRecord) -> None:
        """Nothing to do: a batch's listing row is written with its record, always."""
