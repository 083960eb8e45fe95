"""Fault injection settings, the service capacity and the API request log of the sandbox
forge."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RequestLogEntry:
    """One API request as answered: full path (with /api/v1) and raw query string."""

    method: str
    path: str
    status: int
    query: str

    def to_json(self) -> dict[str, object]:
        """Render as a plain dict."""
        return asdict(self)


@dataclass(frozen=True)
class RequestStart:
    """One API request as it arrived, before any delay, fault, auth or handler ran."""

    method: str
    path: str
    query: str

    def to_json(self) -> dict[str, object]:
        """Render as a plain dict."""
        return asdict(self)


@dataclass(frozen=True)
class Fault:
    """A canned answer for a faulted request."""

    status: int
    retry_after: int | None = None


@dataclass
class _FailRule:
    remaining: int
    fault: Fault
    path_contains: str
    method: str = ""

    def matches(self, path: str, method: str) -> bool:
        return self.path_contains in path and (not self.method or self.method == method)


class Capacity:
    """How many API requests the forge serves at once (0: no limit). The rest wait for a
    slot, so past the knee latency grows with load, as a real server's does: the sandbox
    never errors under load, so latency must be a signal on its own."""

    def __init__(self, limit: int = 0) -> None:
        self.serving = 0  # requests holding a slot now (read from any thread)
        self.peak = 0  # the most seen at once since the limit was last set
        self._slots: asyncio.Semaphore | None = None
        self.limit = 0
        self.set(limit)

    def set(self, limit: int) -> None:
        """Serve at most `limit` requests at once from now on (0: no limit); requests
        already waiting keep the gate they queued at."""
        self.limit = max(0, limit)
        self._slots = asyncio.Semaphore(self.limit) if self.limit else None
        self.peak = self.serving

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot while a request is served, waiting for one when all are taken."""
        async with self._slots or contextlib.nullcontext():
            self.serving += 1
            self.peak = max(self.peak, self.serving)
            try:
                yield
            finally:
                self.serving -= 1


class Faults:
    """Thread-safe fault settings: one-shot failures, a global delay, a failure window;
    and the service capacity (a start-up option, not a fault: `clear` keeps it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_FailRule] = []
        self._fail_until = 0.0
        self._fail_status = 503
        self.delay = 0.0
        self.capacity = Capacity()

    def fail_next(
        self,
        count: int,
        status: int = 503,
        *,
        retry_after: int | None = None,
        path_contains: str = "",
        method: str = "",
    ) -> None:
        """Make the next `count` API requests fail whose path contains `path_contains`
        and, if `method` is given, whose method is `method` (e.g. POST only)."""
        if count > 0:
            rule = _FailRule(count, Fault(status, retry_after), path_contains, method.upper())
            with self._lock:
                self._rules.append(rule)

    def fail_for(self, seconds: float, status: int = 503) -> None:
        """Make every API request fail with `status` for the next `seconds`."""
        with self._lock:
            self._fail_until = time.monotonic() + seconds
            self._fail_status = status

    def clear(self) -> None:
        """Drop pending one-shot failures, the failure window and the delay."""
        with self._lock:
            self._rules.clear()
            self._fail_until = 0.0
            self.delay = 0.0

    def take(self, path: str, method: str = "") -> Fault | None:
        """Return the fault to answer for `method path`, consuming a one-shot rule."""
        if not self._rules and not self._fail_until:
            return None
        with self._lock:
            if self._fail_until and time.monotonic() < self._fail_until:
                return Fault(self._fail_status)
            for rule in self._rules:
                if rule.matches(path, method):
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                    return rule.fault
        return None


class RequestLog:
    """Append-only, thread-safe log of API requests: started ones and answered ones."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._entries: list[RequestLogEntry] = []
        self._started: list[RequestStart] = []

    def begin(self, entry: RequestStart) -> None:
        """Record a request as it arrives (before it is delayed, faulted or answered)."""
        with self._lock:
            self._started.append(entry)
            self._lock.notify_all()

    def started(self) -> list[RequestStart]:
        """Return a copy of the started-requests log."""
        with self._lock:
            return list(self._started)

    def wait_started(self, method: str, path_contains: str, timeout: float, count: int = 1) -> bool:
        """Block until `count` requests `method ...path_contains...` have started."""

        def seen() -> bool:
            hits = [
                e for e in self._started if e.method == method.upper() and path_contains in e.path
            ]
            return len(hits) >= count

        with self._lock:
            return self._lock.wait_for(seen, timeout)

    def append(self, entry: RequestLogEntry) -> None:
        """Record one request."""
        with self._lock:
            self._entries.append(entry)

    def entries(self) -> list[RequestLogEntry]:
        """Return a copy of the log."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        """Forget all recorded requests."""
        with self._lock:
            self._entries.clear()
            self._started.clear()
