"""Crash points: a test hook that kills the process right after the Nth durable write of
one multi-file operation, so that a test can walk N over every write of it.

`DROPBOX_EVAL_CRASH_AFTER=<operation>:<N>` (read once, at import, or again by
`from_environment`) arms it; only the tests' service processes set it. Unarmed, `wrote`
costs one comparison. A durable write is anything a restart sees afterwards: an atomic
file write, an appended journal line, a rename or removal in the state, a write request to
the forge or a callback POST.

Operations nest (a cancel settles): a write counts for every operation open around it.
Writes that land at once (a database COMMIT) are one durable write: `landed_together`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from contextvars import Context, ContextVar, copy_context

ENV = "DROPBOX_EVAL_CRASH_AFTER"
OPERATIONS = frozenset(
    {
        "intake",  # record the batch and its hold, open its issues, file the drop
        "close",  # the record's final status and charge, then the ledger and index row
        "emit",  # the report, the record's emitted_at, then the archive
        "archive",  # keys, archive rows, the index, then the history entry, the live files
        "bury",  # the index (uncounted, burial noted), listing rows, history, the index
        "delivery-schedule",  # a failed delivery: the undelivered copy, then the record
        "cancel",  # the request on the record, closing the issues, then settle
        "expire",  # closing the issues, then settle
        "fund",  # one index write
        "rotate-secret",  # one index write
        "retry",  # the link on the old record, then the new batch (tasks, record, index)
        "sftp-upload",  # the endpoint: fsync the upload, rename it into place, fsync the folder
    }
)
_open: ContextVar[tuple[str, ...]] = ContextVar("crash_operations", default=())
_lock = threading.Lock()
_counts: dict[str, int] = {}


def _armed() -> tuple[str, int] | None:
    value = os.environ.get(ENV, "")
    name, _, count = value.partition(":")
    if name not in OPERATIONS or not count.isdigit() or int(count) < 1:
        return None
    return name, int(count)


_ARMED = _armed()


def from_environment() -> None:
    """Arm from the environment again, counting afresh: for a process forked after this
    module was imported under another environment (the tests' warm fork server)."""
    global _ARMED
    _ARMED = _armed()
    with _lock:
        _counts.clear()


@contextlib.contextmanager
def operation(name: str) -> Iterator[None]:
    """Count the durable writes made inside the block (and in threads started with
    `contextvars.copy_context()` from it) toward `name`."""
    assert name in OPERATIONS, name
    token = _open.set((*_open.get(), name))
    try:
        yield
    finally:
        _open.reset(token)


def wrote(what: str) -> None:
    """Record one durable write; the armed crash point kills the process right after it."""
    if _ARMED is None:
        return
    target, limit = _ARMED
    if target not in _open.get():
        return
    with _lock:
        _counts[target] = _counts.get(target, 0) + 1
        reached = _counts[target] == limit
    if reached:
        sys.stderr.write(f"crash point: {target} write {limit} ({what})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def landed_together(writes: Iterable[tuple[Context, str]]) -> None:
    """Record writes that landed at once (one database COMMIT), each made in its context,
    as one durable write (named after the first) for every operation open around any of
    them: a kill after a second one would find what a kill after the first finds."""
    made = list(writes)
    if not made:
        return
    around = dict.fromkeys(op for context, _what in made for op in context.run(_open.get))
    copy_context().run(_wrote_within, tuple(around), made[0][1])


def _wrote_within(operations: tuple[str, ...], what: str) -> None:
    _open.set(operations)  # in a copied context: the caller's stays as it is
    wrote(what)
