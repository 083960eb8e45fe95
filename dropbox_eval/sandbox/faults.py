"""Fault injection settings and the API request log of the sandbox forge."""

from __future__ import annotations

import threading
import time
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
class Fault:
    """A canned answer for a faulted request."""

    status: int
    retry_after: int | None = None


@dataclass
class _FailRule:
    remaining: int
    fault: Fault
    path_contains: str


class Faults:
    """Thread-safe fault settings: one-shot failures, a global delay, a failure window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_FailRule] = []
        self._fail_until = 0.0
        self._fail_status = 503
        self.delay = 0.0

    def fail_next(
        self, count: int, status: int = 503, *, retry_after: int | None = None,
        path_contains: str = "",
    ) -> None:
        """Make the next `count` API requests whose path contains `path_contains` fail."""
        if count > 0:
            with self._lock:
                self._rules.append(_FailRule(count, Fault(status, retry_after), path_contains))

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

    def take(self, path: str) -> Fault | None:
        """Return the fault to answer for a request to `path`, consuming a one-shot rule."""
        if not self._rules and not self._fail_until:
            return None
        with self._lock:
            if self._fail_until and time.monotonic() < self._fail_until:
                return Fault(self._fail_status)
            for rule in self._rules:
                if rule.path_contains in path:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                    return rule.fault
        return None


class RequestLog:
    """Append-only, thread-safe log of API requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[RequestLogEntry] = []

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
