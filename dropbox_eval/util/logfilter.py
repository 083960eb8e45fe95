"""RepeatFilter: a warning or error that repeats is logged once a minute with its count, and
its traceback once per cause.

A full disk fails every pass of every worker the same way; without this the log takes
thousands of identical lines and tracebacks a minute and hides everything else. Records
below WARNING pass as they are.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

WINDOW_SECONDS = 60.0
MAX_KEYS = 1024  # distinct messages remembered; past that, those out of their window go

Key = tuple[str, int, str, Any]
# `log.warning(..., extra=AUDIT)`: an event someone counts one by one (a refused login, for
# an operator or fail2ban), not a pass failing again: always written
AUDIT = {"audit": True}


class RepeatFilter(logging.Filter):
    """Install on a handler (it then sees every record that handler writes).

    Key of a repeat: logger, level, the message as formatted, and the exception's cause
    (type, errno, where it was raised). The first record of a key passes; the same key
    within `window` seconds of the last one that passed is counted and dropped; the next
    one after the window passes with "(repeated N times in the last 60 s)". A traceback is
    written for the first record of each cause only; later ones name the error instead.
    Audit records (`extra=AUDIT`) always pass.
    """

    def __init__(
        self, window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[Key, tuple[float, int]] = {}  # key -> (last passed at, dropped since)
        self._traced: set[Any] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        """Pass, rewrite or drop one record (see the class docstring)."""
        if record.levelno < logging.WARNING or getattr(record, "audit", False):
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format: the handler reports it as it is
            return True
        cause = _cause(record)
        key = (record.name, record.levelno, message, cause)
        now = self.clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.window:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            self._forget_old(now)
            self._seen[key] = (now, 0)
            first_of_cause = cause is not None and cause not in self._traced
            if first_of_cause:  # bounded: a cause is a place in the code that raises
                self._traced.add(cause)
        dropped = last[1] if last else 0
        since = f"{now - last[0]:.0f}" if last else ""
        suffix = f" (repeated {dropped} times in the last {since} s)" if dropped else ""
        if cause is not None and not first_of_cause:
            suffix += f" [{_named(record)}; traceback logged once before]"
            record.exc_info = None
            record.exc_text = None
        if suffix:
            record.msg, record.args = message + suffix, None
        return True

    def _forget_old(self, now: float) -> None:
        """Past MAX_KEYS, drop the keys whose window has passed (the caller holds the lock)."""
        if len(self._seen) >= MAX_KEYS:
            for key, (at, _) in list(self._seen.items()):
                if now - at >= self.window:
                    del self._seen[key]


def _cause(record: logging.LogRecord) -> Any:
    """(type, errno, file and line it was raised at) of the record's exception, or None."""
    if not record.exc_info or record.exc_info[1] is None:
        return None
    error = record.exc_info[1]
    frames = traceback.extract_tb(error.__traceback__)
    where = (frames[-1].filename, frames[-1].lineno) if frames else None
    return (type(error).__qualname__, getattr(error, "errno", None), where)


def _named(record: logging.LogRecord) -> str:
    """`OSError: [Errno 28] No space left on device`: the exception in one line."""
    assert record.exc_info is not None and record.exc_info[1] is not None
    error = record.exc_info[1]
    return f"{type(error).__name__}: {error}"
