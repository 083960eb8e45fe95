"""Running a store operation again when the database connection broke under it (a
restart, a failover, a cut connection).

Only what is safe to run again from its start is: a pure read, or a whole transaction of
the store's own (its body is the store's method, not a caller's block) whose COMMIT was
never sent, so that nothing of it landed (ConnectionLost, connection.py). It is run again
on a fresh connection a few times with a growing, jittered delay while the database comes
back. A connection lost at a COMMIT already sent leaves the outcome unknown: that is a
plain DatabaseError, never run again blindly. Nor is a caller's `transaction()` block,
nor a change joined to a transaction open in the thread: its psycopg error goes up raw to
the transaction, which fails whole (and is run again whole only when it is one of these
operations); the caller gets the StoreError and tries again later.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from .connection import ConnectionLost

log = logging.getLogger("dropbox_eval")

RERUNS = 4  # after the first try: about 0.2 + 0.4 + 0.8 + 1.6 s of waits, plus jitter
FIRST_WAIT = 0.2  # seconds before the first rerun, doubling
MAX_WAIT = 2.0
# the PostgresStore methods that read only, or are one whole transaction of the store's
READS = (
    "get_batch", "get_tasks", "issue_numbers", "get_report", "is_recorded", "find_batch",
    "list_batches", "page_batches", "history_page", "count_batches", "live_repos",
    "tombstone", "snapshot", "get_client", "list_clients", "ledger", "audit_entries",
)  # fmt: skip
TRANSACTIONS = (
    "commit_new", "update_batch", "update_tasks", "archive", "settle", "bury_batch",
    "erase_batch",
)  # fmt: skip


C = TypeVar("C", bound=type)


def rerunning(cls: C) -> C:
    """The store class with each of its READS and TRANSACTIONS run again on
    ConnectionLost (a misspelt name fails at import, never silently)."""
    for name in (*READS, *TRANSACTIONS):
        setattr(cls, name, _rerun(getattr(cls, name)))
    return cls


def _rerun(operation: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(operation)
    def again(store: object, *args: Any, **kwargs: Any) -> Any:
        try:  # the common case: one try, no retry machinery
            return operation(store, *args, **kwargs)
        except ConnectionLost as exc:
            log.warning("%s; running %s again", exc, operation.__name__)
        time.sleep(FIRST_WAIT)  # tenacity waits only between its own tries
        retrying = Retrying(
            retry=retry_if_exception_type(ConnectionLost),
            stop=stop_after_attempt(RERUNS),
            wait=wait_exponential(multiplier=2 * FIRST_WAIT, max=MAX_WAIT)
            + wait_random(0, FIRST_WAIT),
            reraise=True,
        )
        return retrying(operation, store, *args, **kwargs)

    return again
