"""The store contract: what the rest of the service may ask of the store, and nothing more.

Every part outside `store/` is typed against `Store` (a Protocol); only the composition
root and the CLI's opening of a state folder construct an engine (`engine.TinyDBStore`).
A change to more than one thing at once goes through `with store.transaction() as tx:`:
its changes land when the block ends, in the order they were made, and none of them when
the block raises. Rows come out typed (`BatchRow`), selected by keyword (client, status,
batch, repo, time), never by a Python callback.

An engine's durable writes are what the crash-point walk counts (tests/test_crash_points.py):
an engine calls `util.crashpoints.wrote` after each write a restart would see (a file
replaced or appended, a row committed), so that the same walk runs over any engine.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from ..models import BatchRecord, BatchStatus, Client, LedgerEntry, TaskRecord
from .rows import BatchRow, HistoryPage

if TYPE_CHECKING:
    from .audit import AuditEntry
    from .flags import Flags
    from .nodes import Node
    from .totals import Snapshot

TaskChanges = dict[str, dict[str, Any]]  # task_id -> the fields that change


class Transaction(Protocol):
    """Changes that land together when the transaction's block ends, in the order made;
    none of them when the block raises. Its reads see its own changes."""

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record with this transaction's changes; NotFoundError when unknown."""
        ...

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """The batch's tasks with this transaction's changes."""
        ...

    def record_batch(
        self, batch: BatchRecord, tasks: list[TaskRecord], hold: LedgerEntry | None
    ) -> None:
        """Record a new batch with its tasks and the hold on its client's credits."""
        ...

    def update_batch(
        self, batch_id: str, *, settlement: list[LedgerEntry] | None = None, **fields: Any
    ) -> BatchRecord:
        """Change batch fields (and post the batch's `settlement` once, when it ends);
        returns the record as it will be. `report`: as `Store.update_batch`."""
        ...

    def update_tasks(self, batch_id: str, changes: TaskChanges) -> None:
        """Change fields of the batch's tasks."""
        ...

    def add_client(self, client: Client) -> None:
        """Create a client."""
        ...

    def update_client(self, client_id: str, **fields: Any) -> None:
        """Change client fields other than money (secrets, API key hashes)."""
        ...

    def post_ledger(self, entry: LedgerEntry) -> None:
        """Post a ledger entry: the client's balance and held credits move by it."""
        ...

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once this transaction's changes have landed (not if it raises)."""
        ...


class Store(Protocol):
    """What the rest of the service uses of the store."""

    @property
    def state_dir(self) -> Path:
        """The state folder (other parts keep their own files beside the store's)."""
        ...

    def transaction(
        self, *, preparing: tuple[BatchRecord, list[TaskRecord]] | None = None
    ) -> AbstractContextManager[Transaction]:
        """Hold the store for a read-check-write; the changes land as the block ends, none
        if it raises. A transaction opened inside another in the same thread joins it.
        `preparing`: a new batch the block may record (`record_batch`), which an engine may
        write ahead, unseen until the commit and removed if not recorded."""
        ...

    def arriving(self) -> AbstractContextManager[None]:
        """Around an intake's checks and its `commit_new`: the commit may wait a moment for
        the intakes on their way, to write them in one group."""
        ...

    def commit_new(
        self,
        batch: BatchRecord,
        tasks: list[TaskRecord],
        decide: Callable[[], LedgerEntry | None],
    ) -> None:
        """Record a new batch with its tasks and the hold `decide` returns, durably, in one
        write with the other new batches waiting at the store lock (a group commit).
        `decide` runs under the lock, on the store as the group has changed it so far,
        maybe on another thread (in this one's context); it raises to record nothing, and
        this raises the same."""
        ...

    # -- batches ----------------------------------------------------------------------

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record; NotFoundError when unknown."""
        ...

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """Every task of the batch (the caller must not change them in place)."""
        ...

    def issue_numbers(self, batch_id: str) -> dict[str, int | None]:
        """task_id -> the issue number recorded so far (None: none yet), in task order;
        its cost follows what changed since the last read, not the batch's size."""
        ...

    def get_report(self, batch_id: str) -> bytes | None:
        """The report fixed when the batch ended (`update_batch(report=...)`), its bytes as
        delivered; None when none was fixed (running, unknown, or ended without one)."""
        ...

    def open_report(self, batch_id: str) -> BinaryIO | None:
        """`get_report`'s bytes to read in blocks (the caller closes it), so that a big
        batch's report (12 MB at 50,000 tasks) is copied on, never held whole; None as
        `get_report`."""
        ...

    def update_batch(
        self,
        batch_id: str,
        *,
        settlement: list[LedgerEntry] | None = None,
        when: Callable[[BatchRecord], bool] | None = None,
        **fields: Any,
    ) -> BatchRecord:
        """Change batch fields; returns the new record. `when` refuses the change (the
        record is returned as it is) unless the record as read satisfies it. `report`
        (bytes: the close's report) is kept beside the record, not in it (`get_report`),
        written before the record's change."""
        ...

    def update_tasks(self, batch_id: str, changes: TaskChanges) -> None:
        """Change fields of the batch's tasks."""
        ...

    def archive(self, batch: BatchRecord) -> None:
        """Move an emitted batch out of the live batches (its duplicates stay found)."""
        ...

    def claim_issues(self, batch_id: str, wait: float = 0.0) -> AbstractContextManager[bool]:
        """Hold the right to open or close the batch's issues, across processes; yields
        False when another holder kept it for `wait` seconds."""
        ...

    def is_recorded(self, batch_id: str) -> bool:
        """Whether the batch was recorded (live or archived)."""
        ...

    def find_batch(
        self, client_id: str, *, sha256: str | None = None, batch_ref: str | None = None
    ) -> str | None:
        """The id of an earlier batch of this client with the same bytes or batch_ref."""
        ...

    def list_batches(
        self,
        *,
        live_only: bool = False,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        batch_id: str | None = None,
        repo: str | None = None,
    ) -> list[BatchRow]:
        """Rows matching every filter given, oldest first; `live_only`: batches not yet
        archived (else the whole history: use `page_batches` for listings). `repo` matches
        case-folded."""
        ...

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
        """One page of rows: live batches first, newest created first, then archived ones,
        newest ended first (only ended batches if `finished`); the cost follows
        `offset + limit`, never how the history's batches overlapped in time. `matches`:
        how many rows the filter matches in all (`count_batches`), if known. `after`: a
        cursor, only the rows listed after that batch's row (read up to it, like an
        offset; `history_page`'s cursor costs only its page)."""
        ...

    def history_page(
        self,
        *,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> HistoryPage:
        """Archived batches only, newest ended first (by `(ended_at, batch_id)` as they
        were archived), from `cursor` (an opaque `next_cursor` of an earlier page; None:
        the newest): the page and the next page's cursor. A page costs its rows, whatever
        the history before it; a cursor stays valid while batches are archived and buried
        (a buried batch is left out of the pages after it). ValueError: not a cursor."""
        ...

    def bury_batch(self, batch_id: str, *, reason: str, keep: dict[str, Any] | None = None) -> bool:
        """Replace an archived batch by a tombstone (`keep`, else a bare one: when, why,
        its status), in one step: its record, tasks and listing rows are gone from every
        read (NotFoundError, as for an unknown id) and it is no longer counted; its ledger
        entries and running totals stay. A burial a crash cut short is finished (True), so
        the batch is uncounted once. False when it is not archived (live, unknown, or
        buried already)."""
        ...

    def count_batches(self, client_id: str | None = None) -> dict[str, int]:
        """Batches per status, live and archived, for everyone or one client."""
        ...

    def live_repos(self) -> set[str]:
        """The repos (case-folded) of batches not yet archived."""
        ...

    # -- erasing (tombstones.py) --------------------------------------------------------

    def tombstone(self, batch_id: str) -> dict[str, Any] | None:
        """The tombstone of an erased batch; None when it was not erased."""
        ...

    def erase_batch(self, batch: BatchRecord, tombstone: dict[str, Any]) -> None:
        """Replace an ended, settled batch by `tombstone` (what `tombstone` answers from
        then on): out of the index (its row and ledger entries to the archive), buried
        (`bury_batch`), its duplicate keys removed. Its ledger entries stay."""
        ...

    def snapshot(self) -> Snapshot:
        """Live batch rows, the live ledger, clients and the archive's running totals."""
        ...

    def close(self) -> None:
        """Release what the engine holds open (a database's pooled connections; the files'
        engine holds nothing between calls). The store is not used after."""
        ...

    def node(self, node_id: str, lease_seconds: float) -> Node:
        """This process as node `node_id` among those sharing the store (nodes.py)."""
        ...

    def flags(self) -> Flags | None:
        """The flags every node sees (flags.py); None: the state folder's files are."""
        ...

    # -- clients and money ------------------------------------------------------------

    def get_client(self, client_id: str) -> Client | None:
        """The client, or None when unknown."""
        ...

    def list_clients(self) -> list[Client]:
        """Every client, sorted by id."""
        ...

    def ledger(self, client_id: str, limit: int | None = None) -> list[LedgerEntry]:
        """The client's newest `limit` ledger entries (all without one), oldest first."""
        ...

    def settle(self, entries: list[LedgerEntry]) -> bool:
        """Post a batch's settlement entries once; False if it was settled already."""
        ...

    # -- the audit log (audit.py) -------------------------------------------------------

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
        """Append one operator action (who, what, on what, how it ended) to the audit log."""
        ...

    def audit_entries(self, limit: int | None = None) -> list[AuditEntry]:
        """The newest `limit` operator actions (all without one), oldest first."""
        ...

    # -- the state check (statecheck.py) ------------------------------------------------

    def stored_batch_ids(self) -> list[str]:
        """Ids of every stored batch not yet archived, recorded or not (a recording cut
        short may leave a batch's files without its commit)."""
        ...

    def being_recorded(self, batch_id: str) -> bool:
        """Whether a transaction recording this batch is under way (in any process)."""
        ...

    def drop_unrecorded(self, batch_id: str) -> bool:
        """Remove what a recording cut short left of a batch never recorded; False, and
        nothing removed, when it is recorded or being recorded."""
        ...

    def refresh_row(self, batch: BatchRecord) -> None:
        """Make a live batch's listing row agree with its record."""
        ...
