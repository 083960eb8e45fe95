"""The issue claims of `PostgresStore.claim_issues`: a session advisory lock per batch,
held on a connection kept for it for as long as the claim's block runs.

A session lock lives as long as its connection: a database restart (or a connection cut)
ends it, and another node may then take the batch's claim. So the holder must not go on
believing it still holds it: every new transaction a thread starts while it holds claims
first checks their connections (`verify`, one round trip each), and a lost claim raises
ClaimLost, a DatabaseError that nothing runs again; the block's end says so too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager

import psycopg

from .connection import Connection, DatabaseError, release_claim, try_claim

CLAIM_POLL = 0.05  # seconds between tries of a batch's issue claim while waiting for it


class ClaimLost(DatabaseError):
    """A batch's issue claim ended with its database connection while its holder ran."""

    def __init__(self, batch_id: str, cause: BaseException) -> None:
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        super().__init__(
            f"the issue claim on batch {batch_id} was lost with its database connection "
            f"({reason}); its work stops here and is resumed later"
        )


class Claims:
    """The claims held by each thread of one store."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _held(self) -> list[tuple[str, Connection]]:
        held: list[tuple[str, Connection]] | None = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = []
        return held

    @contextlib.contextmanager
    def hold(
        self, connection: AbstractContextManager[Connection], batch_id: str, wait: float
    ) -> Iterator[bool]:
        """Take the batch's claim on the connection `connection` gives (trying for `wait`
        seconds); yields whether it is ours. ClaimLost at the end when it was lost."""
        with connection as conn:
            deadline = time.monotonic() + wait
            while not (mine := try_claim(conn, batch_id)) and time.monotonic() < deadline:
                time.sleep(CLAIM_POLL)
            if not mine:
                yield False
                return
            entry = (batch_id, conn)
            self._held().append(entry)
            try:
                yield True
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # the block's own error tells more
                    release_claim(conn, batch_id)
                raise
            finally:
                self._held().remove(entry)
            try:
                release_claim(conn, batch_id)
            except psycopg.Error as exc:
                raise ClaimLost(batch_id, exc) from exc

    def verify(self) -> None:
        """ClaimLost when a claim this thread holds was lost with its connection."""
        for batch_id, conn in getattr(self._local, "held", ()):
            try:
                conn.execute("")
            except psycopg.Error as exc:
                raise ClaimLost(batch_id, exc) from exc
