"""The sandbox forge's clock: the machine's, or a manual one a test steps through.

Every timestamp the forge writes (created, updated, closed, merged) and the `Date` header it
answers with come from `ForgeState.clock`, so a test can replay a history at chosen forge
instants without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Clock = Callable[[], float]


class ManualClock:
    """A clock that moves only when told to (whole seconds, like Gitea's timestamps)."""

    def __init__(self, start: float | None = None) -> None:
        self._now = float(int(time.time() if start is None else start))
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (never back); the new time."""
        with self._lock:
            self._now += max(0.0, seconds)
            return self._now

    def set(self, moment: float) -> float:
        """Move forward to `moment` (a moment in the past leaves the clock where it is)."""
        with self._lock:
            self._now = max(self._now, moment)
            return self._now
