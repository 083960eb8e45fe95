"""Failed-login limits per source address and session limits per client."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable


class FailureLimiter:
    """At most `max_failures` failed logins per address within `window` seconds.

    An address over the limit is refused as soon as it connects, until its oldest counted
    failure leaves the window.
    """

    def __init__(
        self, max_failures: int, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`clock` is injectable for tests; monotonic by default."""
        self.max_failures = max_failures
        self.window = window
        self._clock = clock
        self._failures: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def _prune(self, address: str, now: float) -> deque[float]:
        times = self._failures[address]
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def blocked(self, address: str) -> bool:
        """Whether `address` has used up its failures."""
        with self._lock:
            return len(self._prune(address, self._clock())) >= self.max_failures

    def failed(self, address: str) -> int:
        """Count one failed login; returns the failures now in the window."""
        with self._lock:
            now = self._clock()
            self._prune(address, now)
            self._failures[address].append(now)
            return len(self._failures[address])


class SessionCounter:
    """Concurrent sessions per client, capped at `limit`."""

    def __init__(self, limit: int) -> None:
        """`limit` sessions per client at once."""
        self.limit = limit
        self._open: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def acquire(self, client_id: str) -> bool:
        """Take a slot; False (nothing taken) when the client is at its limit."""
        with self._lock:
            if self._open[client_id] >= self.limit:
                return False
            self._open[client_id] += 1
            return True

    def release(self, client_id: str) -> None:
        """Give back a slot taken by `acquire`."""
        with self._lock:
            self._open[client_id] -= 1
            if self._open[client_id] <= 0:
                del self._open[client_id]

    def count(self, client_id: str) -> int:
        """Sessions the client has open now."""
        with self._lock:
            return self._open.get(client_id, 0)
