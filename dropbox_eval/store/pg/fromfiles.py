"""Moving a TinyDB state folder into an empty PostgreSQL database (`dropbox-eval migrate
--from-files`): its clients (keys and secrets), its ledger (the same entry ids, order,
times and balances after each), its batches live, archived and buried (records, tasks,
listing rows, reports, tombstones, the history's order) and its audit log.

The copy is one database transaction that first takes the store lock and locks the
tables against every writer, then refuses a database holding any client, batch, ledger
entry or audit entry (NotEmpty): nothing is merged, and a copy cut short (an error, a
kill) leaves the database as empty as it found it.

The folder is read through the store contract, except for what the contract does not
tell: the order the history archived its batches in, and the listing rows of the buried
ones (both from `archive/batches.jsonl`, as the engine's own listings read it). Rows are
written as SQL, not through the engine's writes: those move balances and stamp the time,
where a copy must keep both as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ...errors import Conflict, NotFoundError, StoreError
from ...models import BatchRecord, LedgerEntry, TaskRecord
from .. import totals
from ..engine import TinyDBStore
from ..files import newest_lines_at
from ..paging import public
from ..rows import BatchRow, Row, dump, summary_row
from ..sftpkeyfiles import SftpKeyFiles
from ..sftpkeys import fingerprint_of
from .connection import LOCK_SPACE, STORE_LOCK, Connection, connect, database_errors, describe
from .sftpkeys import HOST_KEY_ALGORITHM
from .writes import add_action, add_client, jsonb

# what a database to fill must lack: table -> what its rows are
TABLES = {
    "clients": "clients",
    "batches": "batches",
    "ledger": "ledger entries",
    "audit_log": "audit entries",
}
ARCHIVE_ROWS = "batches.jsonl"  # under archive/: every archived batch's listing row
FLUSH_ROWS = 5000  # batch and task rows buffered before they are written
FLUSH_BYTES = 32 << 20  # or report bytes
BATCH_DEFAULTS: dict[str, Any] = dict.fromkeys(
    ("record", "report", "task_counts", "tombstone", "archived_at"), None
) | {"archived": False}
# an archived batch takes the history's next place: the copy's order is the folder's
INSERT_BATCH = (
    "INSERT INTO batches (batch_id, client_id, status, repo_folded, summary, sha256,"
    " batch_ref, record, report, task_counts, tombstone, archived_at, archive_seq)"
    " VALUES (%(batch_id)s, %(client_id)s, %(status)s, %(repo_folded)s, %(summary)s,"
    " %(sha256)s, %(batch_ref)s, %(record)s, %(report)s, %(task_counts)s, %(tombstone)s,"
    " CASE WHEN %(archived)s THEN coalesce(%(archived_at)s::timestamptz, now()) END,"
    " CASE WHEN %(archived)s THEN nextval('history_order') END)"
)
INSERT_TASK = "INSERT INTO tasks (batch_id, position, task_id, doc) VALUES (%s, %s, %s, %s)"


# the folder's host key is the one its clients pinned: it replaces one an endpoint made
# on this empty database (nobody could log in to that one: there was no client)
_HOST_KEY = """INSERT INTO sftp_host_keys VALUES (%s, %s, now())
    ON CONFLICT (algorithm) DO UPDATE SET private_key = excluded.private_key"""
_SFTP_KEY = """INSERT INTO sftp_keys (client_id, fingerprint, line, added_at, last_used_at)
    VALUES (%s, %s, %s, coalesce(%s::timestamptz, now()), %s::timestamptz)"""


class NotEmpty(Conflict):
    """The database already holds a service's data: a copy would merge two ledgers."""

    reason = "database_not_empty"


class SourceNotReady(Conflict):
    """The state folder to copy is not consistent: its own state check found something."""

    reason = "source_not_consistent"


@dataclass
class Copied:
    """What a copy wrote."""

    clients: int = 0
    ledger: int = 0
    live: int = 0
    archived: int = 0
    buried: list[str] = field(default_factory=list)  # ids of the tombstones copied
    tasks: int = 0
    reports: int = 0
    audit: int = 0
    sftp_keys: int = 0
    sftp_host_key: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    def line(self) -> str:
        """One line for the operator."""
        batches = self.live + self.archived + len(self.buried)
        return (
            f"{self.clients} clients, {self.ledger} ledger entries, {batches} batches "
            f"({self.live} live, {self.archived} archived, {len(self.buried)} deleted: "
            f"tombstones), {self.tasks} tasks, {self.reports} reports, "
            f"{self.audit} audit entries, {self.sftp_keys} SFTP keys"
            f"{', the SFTP host key' if self.sftp_host_key else ''}"
        )


@dataclass(frozen=True)
class _Archived:
    """An archived batch as the archive file lists it: its listing row, and whether it
    was buried since."""

    row: Row
    buried: bool


def copy_state(source: TinyDBStore, url: str) -> Copied:
    """Copy everything `source` holds into the database at `url` (its schema up to date),
    in one transaction; NotEmpty, nothing written, when the database holds data. The
    caller keeps `source` from changing meanwhile (its store lock, no service running)."""
    copied = Copied()
    with connect(url) as conn, database_errors(url), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_SPACE, STORE_LOCK))
        # writers that skip the store lock (a task's change, an audit line) wait too
        conn.execute(f"LOCK TABLE {', '.join(TABLES)}, tasks IN SHARE ROW EXCLUSIVE MODE")
        _refuse_filled(conn, url)
        for client in source.list_clients():
            add_client(conn, client)
            copied.clients += 1
        rows = _Rows(conn)
        live = {row.batch_id for row in source.list_batches(live_only=True)}
        for batch_id in sorted(live):
            _copy_live(rows, source, source.get_batch(batch_id), copied)
        for archived in _archived(source):
            if archived.row["batch_id"] not in live:  # a crash between the two writes
                _copy_archived(rows, source, archived, copied)
        rows.flush()
        copied.ledger = _copy_ledger(conn, source)
        for entry in source.audit_entries():
            add_action(conn, entry)
            copied.audit += 1
        _copy_sftp_keys(conn, SftpKeyFiles(source.state_dir), source, copied)
    return copied


def _copy_sftp_keys(
    conn: Connection, files: SftpKeyFiles, source: TinyDBStore, copied: Copied
) -> None:
    """The folder's SFTP host key and each client's keys, in the order added, with when
    each was added and last used (the endpoint reads them from the database now)."""
    host_key = files.stored_host_key()
    if host_key is not None:
        conn.execute(_HOST_KEY, (HOST_KEY_ALGORITHM, host_key.decode()))
        copied.sftp_host_key = True
    for client in source.list_clients():
        times = files.times(client.client_id)
        for line in files.lines(client.client_id):
            fingerprint = fingerprint_of(line)
            if fingerprint is None:
                continue
            when = times.get(fingerprint, {})
            conn.execute(
                _SFTP_KEY,
                (
                    client.client_id,
                    fingerprint,
                    line,
                    when.get("added_at"),
                    when.get("last_used_at"),
                ),
            )
            copied.sftp_keys += 1


def _refuse_filled(conn: Connection, url: str) -> None:
    held: dict[str, int] = {}
    for table in TABLES:
        found = conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
        if found is not None and found["n"]:
            held[table] = int(found["n"])
    if held:
        what = ", ".join(f"{n} {TABLES[table]}" for table, n in held.items())
        raise NotEmpty(
            f"the database {describe(url)} already holds data ({what}): a TinyDB state is "
            "copied only into an empty database, so that no two ledgers are merged; "
            "nothing was copied. Point SAAS_EVAL_DATABASE_URL at a new, empty database "
            "(or empty this one) and run the copy again",
            **held,
        )


class _Rows:
    """Batch rows and their tasks' rows, buffered and written in their order a buffer at
    a time (psycopg pipelines an executemany: one round trip per buffer, not per row)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.batches: list[dict[str, Any]] = []
        self.tasks: list[tuple[str, int, str, Any]] = []
        self.size = 0  # report bytes buffered

    def add(self, columns: dict[str, Any], tasks: list[TaskRecord]) -> None:
        batch_id = columns["batch_id"]
        self.batches.append({**BATCH_DEFAULTS, **columns})
        self.tasks += [(batch_id, n, t.task_id, jsonb(dump(t))) for n, t in enumerate(tasks)]
        self.size += len(columns.get("report") or b"")
        if len(self.batches) + len(self.tasks) >= FLUSH_ROWS or self.size >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        with self.conn.cursor() as cursor:
            if self.batches:  # first: the tasks' rows name them
                cursor.executemany(INSERT_BATCH, self.batches)
            if self.tasks:
                cursor.executemany(INSERT_TASK, self.tasks)
        self.batches, self.tasks, self.size = [], [], 0


def _copy_live(rows: _Rows, source: TinyDBStore, batch: BatchRecord, copied: Copied) -> None:
    """A live batch: its listing row is its record's, as the database's always is."""
    report = source.get_report(batch.batch_id)
    tasks = source.get_tasks(batch.batch_id)
    rows.add(
        _columns(batch.client_id, summary_row(batch), batch.sha256, batch.batch_ref)
        | {"record": jsonb(dump(batch)), "report": report},
        tasks,
    )
    copied.live += 1
    copied.tasks += len(tasks)
    copied.reports += report is not None


def _copy_archived(rows: _Rows, source: TinyDBStore, archived: _Archived, copied: Copied) -> None:
    """An archived batch, in the history's order, with the row its listings show; a buried
    one as its tombstone (its tasks per status kept, as the running totals count them)."""
    row = public(archived.row)
    batch_id, client_id = str(row["batch_id"]), str(row["client_id"])
    listed = BatchRow.model_validate(row).as_dict()
    at = {"archived": True, "archived_at": archived.row.get("archived_at")}
    if archived.buried:
        tombstone = source.tombstone(batch_id)
        if tombstone is None:
            raise StoreError(f"batch {batch_id}: buried in the archive, but it has no tombstone")
        sha256, ref = _kept_keys(source, client_id, batch_id, row)
        buried = {"tombstone": jsonb(tombstone), "task_counts": jsonb(_counts_of(tombstone))}
        rows.add(_columns(client_id, listed, sha256, ref) | at | buried, [])
        copied.buried.append(batch_id)
        return
    try:
        batch = source.get_batch(batch_id)
        tasks = source.get_tasks(batch_id)
    except NotFoundError:
        raise StoreError(
            f"batch {batch_id}: listed in the archive, but the history has no record of it"
        ) from None
    report = source.get_report(batch_id)
    counts = totals.task_counts({"status": str(task.status)} for task in tasks)
    kept = {"record": jsonb(dump(batch)), "report": report, "task_counts": jsonb(counts)}
    rows.add(_columns(client_id, listed, batch.sha256, batch.batch_ref) | at | kept, tasks)
    copied.archived += 1
    copied.tasks += len(tasks)
    copied.reports += report is not None


def _columns(
    client_id: str, listed: Row, sha256: str | None, batch_ref: str | None
) -> dict[str, Any]:
    return {
        "batch_id": listed["batch_id"],
        "client_id": client_id,
        "status": str(listed["status"]),
        "repo_folded": str(listed["repo"]).casefold(),
        "summary": jsonb(listed),
        "sha256": sha256,
        "batch_ref": batch_ref,
    }


def _copy_ledger(conn: Connection, source: TinyDBStore) -> int:
    """Every client's entries as they are (ids, amounts after, times), in posting order:
    each client's as the folder lists them, the clients' merged by time."""
    entries: list[LedgerEntry] = []
    for client in source.list_clients():
        entries += source.ledger(client.client_id)
    entries.sort(key=lambda entry: entry.at)  # stable: a client's own order stays
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO ledger (entry_id, client_id, kind, amount, held_change,"
            " balance_after, held_after, batch_id, note, at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    e.entry_id,
                    e.client_id,
                    e.kind,
                    e.amount,
                    e.held_change,
                    e.balance_after,
                    e.held_after,
                    e.batch_id,
                    e.note,
                    e.at,
                )
                for e in entries
            ],
        )
    return len(entries)


def _archived(source: TinyDBStore) -> Iterator[_Archived]:
    """Every batch the archive file lists, oldest archived first, each once with its row
    as the engine's listings read it (the newest line of each id wins; a tombstone line
    marks a burial and hides the rows before it)."""
    newest_first: list[_Archived] = []
    seen: set[str] = set()
    buried: set[str] = set()
    for _offset, row in newest_lines_at(source.archive_dir / ARCHIVE_ROWS):
        batch_id = str(row.get("batch_id"))
        if row.get("tombstone"):
            buried.add(batch_id)
        elif batch_id not in seen:
            seen.add(batch_id)
            newest_first.append(_Archived(row, batch_id in buried))
    return reversed(newest_first)


def _kept_keys(
    source: TinyDBStore, client_id: str, batch_id: str, row: Row
) -> tuple[str | None, str | None]:
    """A buried batch's duplicate keys, where they still find it (erasing drops them)."""
    sha256, ref = row.get("sha256"), row.get("batch_ref")
    kept_sha = (
        sha256 if sha256 and source.find_batch(client_id, sha256=sha256) == batch_id else None
    )
    kept_ref = ref if ref and source.find_batch(client_id, batch_ref=ref) == batch_id else None
    return kept_sha, kept_ref


def _counts_of(tombstone: dict[str, Any]) -> dict[str, int]:
    """Tasks per status from a deleted batch's tombstone (`counts`: `total`, `passed`,
    `failed` and each status that occurred); empty when it has none."""
    counts = tombstone.get("counts")
    if not isinstance(counts, dict):
        return {}
    return {str(k): int(v) for k, v in counts.items() if k != "total" and v}
