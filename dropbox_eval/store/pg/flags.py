"""Flags as rows of `flags` (0005_flags.sql; store/flags.py says what they are for)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from .connection import Connection, database_errors

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool


class PgFlags:
    """The flags of the database behind `pool`."""

    def __init__(self, pool: ConnectionPool[Connection], url: str) -> None:
        self._pool = pool
        self._url = url

    def get(self, name: str) -> dict[str, Any] | None:
        """The flag's record, or None when it is not set."""
        with database_errors(self._url), self._pool.connection() as conn:
            row = conn.execute("SELECT record FROM flags WHERE name = %s", (name,)).fetchone()
        return None if row is None else dict(row["record"])

    def set_first(self, name: str, record: dict[str, Any]) -> dict[str, Any]:
        """Set unless set already (the first setter's record is kept); what holds now."""
        with database_errors(self._url), self._pool.connection() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO flags VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                (name, Jsonb(record)),
            )
            row = conn.execute("SELECT record FROM flags WHERE name = %s", (name,)).fetchone()
        return record if row is None else dict(row["record"])

    def clear(self, name: str) -> dict[str, Any] | None:
        """Clear the flag; the record that was set, or None."""
        with database_errors(self._url), self._pool.connection() as conn:
            row = conn.execute(
                "DELETE FROM flags WHERE name = %s RETURNING record", (name,)
            ).fetchone()
        return None if row is None else dict(row["record"])
