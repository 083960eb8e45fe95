"""The schema's versions: `migrations/NNNN_name.sql` in this package, applied in order,
each in its own transaction with its row in `schema_migrations`, under an advisory lock so
that nodes starting at once apply each version once (the others wait, then find it done).

`dropbox-eval migrate` runs it; so does every engine that opens the database for writing.
A database at a newer version than this code knows is refused: an older node must not
write under a schema it does not know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from ...errors import NoState, StoreError
from .connection import LOCK_SPACE, MIGRATE_LOCK, Connection, connect, database_errors, describe

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LEDGER = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL
)"""


@dataclass(frozen=True)
class Migration:
    """One versioned SQL file of the package."""

    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """The package's migrations, oldest first."""
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    """The version this code's schema is at."""
    return migrations()[-1].version


def migrate(url: str) -> list[str]:
    """Bring the database up to this code's schema; the names applied now (none: it was
    up to date)."""
    with connect(url) as conn, database_errors(url):
        conn.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_SPACE, MIGRATE_LOCK))
        try:
            conn.execute(_LEDGER)
            done = applied(conn)
            _refuse_newer(url, done)
            applied_now = []
            for migration in migrations():
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations VALUES (%s, %s, now())",
                        (migration.version, migration.name),
                    )
                applied_now.append(f"{migration.version:04d}_{migration.name}")
            return applied_now
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_SPACE, MIGRATE_LOCK))


def check_schema(url: str) -> None:
    """For a reader that changes nothing: NoState when the schema was never created,
    StoreError when it is older or newer than this code's."""
    with connect(url) as conn, database_errors(url):
        row = conn.execute("SELECT to_regclass('schema_migrations') AS ledger").fetchone()
        if row is None or row["ledger"] is None:
            raise NoState(
                f"no dropbox-eval schema in the database {describe(url)}: run "
                "`dropbox-eval migrate` (or `dropbox-eval run`, which creates it)"
            )
        done = applied(conn)
    _refuse_newer(url, done)
    if max(done, default=0) < latest_version():
        raise StoreError(
            f"the database {describe(url)} is at schema version {max(done, default=0)}, "
            f"this version of dropbox-eval needs {latest_version()}: run `dropbox-eval migrate`"
        )


def applied(conn: Connection) -> set[int]:
    """The versions recorded in the database."""
    rows = conn.execute("SELECT version FROM schema_migrations").fetchall()
    return {int(row["version"]) for row in rows}


def _refuse_newer(url: str, done: set[int]) -> None:
    if max(done, default=0) > latest_version():
        raise StoreError(
            f"the database {describe(url)} is at schema version {max(done)}, newer than this "
            f"version of dropbox-eval knows ({latest_version()}): upgrade dropbox-eval"
        )
