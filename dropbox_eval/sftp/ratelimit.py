"""Failed-login limits per source address and user name, and session limits per client."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

MAX_TRACKED_ADDRESSES = 100_000  # past this, every expired entry is dropped: memory stays bounded


class FailureLimiter:
    """Failed logins within `window` seconds, counted per source address and user name.

    An address and user with `max_failures` failures is refused for that user: a client
    that keeps failing (a wrong key, a script retrying) locks out only itself, never the
    other clients behind the same address (a shared NAT). An address whose failures name
    `max_users` different users is refused for every user: that is a password spray across
    accounts, not one client's mistake. A refusal lasts until the oldest counted failure
    leaves the window.
    """

    def __init__(
        self,
        max_failures: int,
        max_users: int,
        window: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` is injectable for tests; monotonic by default."""
        self.max_failures = max_failures
        self.max_users = max_users
        self.window = window
        self._clock = clock
        self._failures: dict[str, dict[str, deque[float]]] = {}
        self._lock = threading.Lock()

    def refusal(self, address: str, user: str | None = None) -> str | None:
        """Why a login from `address` (as `user`, once it is known) is refused now, in the
        words the client is shown; None when it may try."""
        with self._lock:
            users = self._prune(address, self._clock())
            if len(users) >= self.max_users:
                return "too many failed logins from your address; try again later"
            if user is not None and len(users.get(user, ())) >= self.max_failures:
                return f"too many failed logins as {user!r} from your address; try again later"
            return None

    def failed(self, address: str, user: str) -> int:
        """Count one failed login; returns the failures of this address and user now in
        the window."""
        with self._lock:
            now = self._clock()
            if len(self._failures) > MAX_TRACKED_ADDRESSES:
                for known in list(self._failures):
                    self._prune(known, now)
            users = self._prune(address, now)
            times = users.setdefault(user, deque())
            times.append(now)
            self._failures[address] = users
            return len(times)

    def _prune(self, address: str, now: float) -> dict[str, deque[float]]:
        users = self._failures.get(address, {})
        for user in list(users):
            times = users[user]
            while times and times[0] <= now - self.window:
                times.popleft()
            if not times:
                del users[user]
        if not users:
            self._failures.pop(address, None)
        return users


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
