"""Connections to the database: the pool, the advisory-lock keys, and the one boundary
where psycopg's errors become the service's (StoreError, with the cause in one line).

A database restart breaks every open connection. The pool checks a connection before
handing it out (a dead one is replaced), and a connection lost under a statement or a
transaction is told apart (`ConnectionLost`: nothing was committed, rerun.py may run the
operation again) from one lost at a COMMIT already sent (`committing`: its outcome is
unknown, a plain DatabaseError).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import NotFoundError, StoreError

Connection = psycopg.Connection[DictRow]
POOL_MAX = 16  # a thread in a transaction may read on a second connection meanwhile
POOL_TIMEOUT = 10.0  # seconds to wait for a connection before the operation fails
CONNECT_TIMEOUT = 10  # seconds, for each new connection
# a link that died silently (a host or a network gone, no reset sent) is found within
# about 25 s (TCP keepalives) or 30 s of unanswered data, not after the kernel's hours
LINK_CHECKS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms
    "application_name": "dropbox-eval",  # the nodes' sessions in pg_stat_activity
}
# a failed connection attempt is retried with a doubling delay for this long, then the
# next request starts over from 1 s: after a long outage the pool is back within seconds
# (psycopg_pool's default of 300 s doubles to a minute or more between attempts)
RECONNECT_TIMEOUT = 10.0
# what says the connection itself is gone: class 08 (connection exception), the server
# shutting down or restarting (57P01-57P03), and psycopg's own errors (no SQLSTATE)
LOST_STATES = ("08", "57P01", "57P02", "57P03")
# pg_advisory_*lock(LOCK_SPACE, key): the store lock, migrations, and issues per batch
LOCK_SPACE = 0x0DBE
STORE_LOCK = 1
MIGRATE_LOCK = 2
CLAIM_SPACE = 0x0DBF  # pg_try_advisory_lock(CLAIM_SPACE, hashtext(batch_id))


class DatabaseError(StoreError):
    """The database refused or could not be reached; the message says which and why."""


class ConnectionLost(DatabaseError):
    """The connection broke under a statement or a transaction before its COMMIT was sent:
    a transaction's changes did not land (an autocommit statement's outcome is unknown)."""


@contextlib.contextmanager
def database_errors(url: str) -> Iterator[None]:
    """Translate psycopg's and the pool's errors raised in the block (errors of the caller's
    own code go through as they are)."""
    try:
        yield
    except PoolTimeout:
        raise DatabaseError(
            f"no database connection within {POOL_TIMEOUT:g} s ({describe(url)})"
        ) from None
    except psycopg.OperationalError as exc:
        lost = ConnectionLost if is_lost(exc) else DatabaseError
        raise lost(f"database {describe(url)} unreachable: {_first_line(exc)}") from exc
    except psycopg.DataError as exc:
        if "NUL" not in str(exc):
            raise DatabaseError(f"database {describe(url)}: {_first_line(exc)}") from exc
        # a key with a NUL byte (hostile input: ids are checked before they are stored)
        # names nothing PostgreSQL can hold
        raise NotFoundError("no such name: it holds a NUL byte") from None
    except psycopg.Error as exc:
        raise DatabaseError(f"database {describe(url)}: {_first_line(exc)}") from exc


@contextlib.contextmanager
def committing(url: str) -> Iterator[Callable[[], None]]:
    """Around `conn.transaction()`: the block calls what this yields as its body ends, and
    a connection lost from then on (at the COMMIT) raises a DatabaseError saying that the
    transaction may or may not have landed, never a ConnectionLost (never run again)."""
    sent = False

    def send() -> None:
        nonlocal sent
        sent = True

    try:
        yield send
    except psycopg.OperationalError as exc:
        if not (sent and is_lost(exc)):
            raise
        raise DatabaseError(
            f"database {describe(url)}: the connection broke at COMMIT, so the transaction "
            f"may or may not have landed: {_first_line(exc)}"
        ) from exc


def is_lost(exc: psycopg.OperationalError) -> bool:
    """Whether the error says that the connection is gone (not a refusal of the query)."""
    state = exc.sqlstate
    return state is None or state.startswith(LOST_STATES)


class _Check:
    """The pool's check of a connection before it is handed out (one round trip). One found
    dead says the server restarted or cut its connections: the other idle ones are swept at
    once, else the pool would find them dead one by one, waiting 1, 2, 4... s in between."""

    def __init__(self) -> None:
        self.pool: ConnectionPool[Connection] | None = None

    def __call__(self, conn: Connection) -> None:
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error:
            if self.pool is not None:
                self.pool.check()
            raise


def open_pool(url: str) -> ConnectionPool[Connection]:
    """A pool of autocommit connections returning rows as dicts (a write opens its own
    transaction: `conn.transaction()`), each checked before it is handed out."""
    check = _Check()
    with database_errors(url):
        pool: ConnectionPool[Connection] = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            timeout=POOL_TIMEOUT,
            check=check,
            reconnect_timeout=RECONNECT_TIMEOUT,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "connect_timeout": CONNECT_TIMEOUT,
                **LINK_CHECKS,
            },
            connection_class=psycopg.Connection[DictRow],
            name="dropbox-eval-store",
            open=True,
        )
    check.pool = pool
    return pool


def connect(url: str) -> Connection:
    """One connection outside the pool (migrations)."""
    with database_errors(url):
        return psycopg.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT,
            **LINK_CHECKS,  # type: ignore[arg-type]
        )


def try_claim(conn: Connection, batch_id: str) -> bool:
    """Take the batch's issue claim on this connection's session, if nobody holds it."""
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS mine", (CLAIM_SPACE, batch_id)
    ).fetchone()
    return bool(row and row["mine"])


def release_claim(conn: Connection, batch_id: str) -> None:
    """Give the batch's issue claim back."""
    conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (CLAIM_SPACE, batch_id))


def describe(url: str) -> str:
    """The database's host, port and name, never its password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(an unreadable SAAS_EVAL_DATABASE_URL)"
    host = info.get("host") or "localhost"
    return f"{info.get('dbname') or '?'} on {host}:{info.get('port') or 5432}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
