"""The SFTP keys on PostgreSQL (store/sftpkeys.py says what they are; 0004_sftp.sql).

Every node sharing the database reads the same rows: each endpoint shows the one host key
and takes the same client keys, read at each login and each upload's start, so a key added
or revoked on one node counts on every other without a restart. The host key is made by
the first node that needs it: an INSERT ... ON CONFLICT DO NOTHING, then read back, so
nodes starting at once all end up with the one that landed. A state folder that already
holds a host key (a service moved from files to the database) offers it rather than a new
one, so the clients' pinned key stays right.

The host private key is a secret at rest, kept as the clients' webhook secrets are: in the
database, whose access the operator controls; only `host_key` reads it, and it is never
logged nor shown (the state folder gets only its public half, sftp/status.py). Times are
the database's `now()`, so nodes' clocks never have to agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from ...errors import StoreError
from .connection import database_errors, describe, open_pool

HOST_KEY_ALGORITHM = "ssh-ed25519"
_AT = """to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"""
_HOST_KEY = "SELECT private_key FROM sftp_host_keys WHERE algorithm = %s"
_OFFER_HOST_KEY = """INSERT INTO sftp_host_keys (algorithm, private_key, created_at)
    VALUES (%s, %s, now()) ON CONFLICT (algorithm) DO NOTHING"""
_LINES = "SELECT line FROM sftp_keys WHERE client_id = %s ORDER BY seq"
_TIMES = f"""SELECT fingerprint, {_AT.format("added_at")} AS added_at,
    {_AT.format("last_used_at")} AS last_used_at FROM sftp_keys WHERE client_id = %s"""
_ADD = """INSERT INTO sftp_keys (client_id, fingerprint, line, added_at)
    VALUES (%s, %s, %s, now()) ON CONFLICT (client_id, fingerprint) DO NOTHING
    RETURNING fingerprint"""
_REMOVE = "DELETE FROM sftp_keys WHERE client_id = %s AND fingerprint = %s"
_REMOVE_ALL = "DELETE FROM sftp_keys WHERE client_id = %s"
_NOTE_USE = """UPDATE sftp_keys SET last_used_at = now()
    WHERE client_id = %s AND fingerprint = %s
    AND (last_used_at IS NULL OR last_used_at < now() - make_interval(secs => %s))"""


class PgSftpKeys:
    """The SftpKeys contract (store/sftpkeys.py) on the database at `url`. `local` gives
    the host key this node's state folder holds, if any (offered when the database has
    none yet)."""

    def __init__(self, url: str, local: Callable[[], bytes | None] | None = None) -> None:
        """Opens a small pool of its own (the endpoint reads at each login)."""
        self.url = url
        self._local = local
        self._pool = open_pool(url)

    def host_key(self, new_key: Callable[[], bytes]) -> bytes:
        """The shared host private key; the first node to ask stores its offer."""
        with database_errors(self.url), self._pool.connection() as conn:
            row = conn.execute(_HOST_KEY, (HOST_KEY_ALGORITHM,)).fetchone()
            if row is None:
                offered = (self._local() if self._local else None) or new_key()
                conn.execute(_OFFER_HOST_KEY, (HOST_KEY_ALGORITHM, offered.decode()))
                row = conn.execute(_HOST_KEY, (HOST_KEY_ALGORITHM,)).fetchone()
        if row is None:  # removed between the two statements: the next start makes one
            raise StoreError(
                f"the SFTP host key was removed from the database {describe(self.url)} "
                "while it was being stored: start the endpoint again"
            )
        return str(row["private_key"]).encode()

    def lines(self, client_id: str) -> list[str]:
        """The client's key lines, oldest first."""
        with database_errors(self.url), self._pool.connection() as conn:
            rows = conn.execute(_LINES, (client_id,)).fetchall()
        return [str(row["line"]) for row in rows]

    def times(self, client_id: str) -> dict[str, dict[str, str]]:
        """When each key was added and last used."""
        with database_errors(self.url), self._pool.connection() as conn:
            rows = conn.execute(_TIMES, (client_id,)).fetchall()
        return {
            str(row["fingerprint"]): {
                name: str(row[name]) for name in ("added_at", "last_used_at") if row[name]
            }
            for row in rows
        }

    def add(self, client_id: str, keys: Sequence[tuple[str, str]]) -> list[str]:
        """Insert the keys the client has not; all or none of them land."""
        added: list[str] = []
        with database_errors(self.url), self._pool.connection() as conn, conn.transaction():
            for fingerprint, line in keys:
                row = conn.execute(_ADD, (client_id, fingerprint, line)).fetchone()
                if row is not None:
                    added.append(str(row["fingerprint"]))
        return added

    def remove(self, client_id: str, fingerprint: str) -> bool:
        """Delete the key's row."""
        with database_errors(self.url), self._pool.connection() as conn:
            return conn.execute(_REMOVE, (client_id, fingerprint)).rowcount > 0

    def remove_all(self, client_id: str) -> int:
        """Delete every key row of the client."""
        with database_errors(self.url), self._pool.connection() as conn:
            return conn.execute(_REMOVE_ALL, (client_id,)).rowcount

    def note_use(self, client_id: str, fingerprint: str, step: timedelta) -> None:
        """One UPDATE, a no-op while the last use written is younger than `step`."""
        with database_errors(self.url), self._pool.connection() as conn:
            conn.execute(_NOTE_USE, (client_id, fingerprint, step.total_seconds()))

    def close(self) -> None:
        """Close the pool's connections."""
        self._pool.close()
