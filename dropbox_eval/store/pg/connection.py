"""Connections to the database: the pool, the advisory-lock keys, and the one boundary
where psycopg's errors become the service's (StoreError, with the cause in one line)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import StoreError

Connection = psycopg.Connection[DictRow]
POOL_MAX = 16  # a thread in a transaction may read on a second connection meanwhile
POOL_TIMEOUT = 10.0  # seconds to wait for a connection before the operation fails
CONNECT_TIMEOUT = 10  # seconds, for each new connection
# pg_advisory_*lock(LOCK_SPACE, key): the store lock, migrations, and issues per batch
LOCK_SPACE = 0x0DBE
STORE_LOCK = 1
MIGRATE_LOCK = 2
CLAIM_SPACE = 0x0DBF  # pg_try_advisory_lock(CLAIM_SPACE, hashtext(batch_id))


class DatabaseError(StoreError):
    """The database refused or could not be reached; the message says which and why."""


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
        raise DatabaseError(f"database {describe(url)} unreachable: {_first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"database {describe(url)}: {_first_line(exc)}") from exc


def open_pool(url: str) -> ConnectionPool[Connection]:
    """A pool of autocommit connections returning rows as dicts (a write opens its own
    transaction: `conn.transaction()`)."""
    with database_errors(url):
        pool: ConnectionPool[Connection] = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            timeout=POOL_TIMEOUT,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "connect_timeout": CONNECT_TIMEOUT,
            },
            connection_class=psycopg.Connection[DictRow],
            name="dropbox-eval-store",
            open=True,
        )
    return pool


def connect(url: str) -> Connection:
    """One connection outside the pool (migrations)."""
    with database_errors(url):
        return psycopg.connect(
            url, autocommit=True, row_factory=dict_row, connect_timeout=CONNECT_TIMEOUT
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
