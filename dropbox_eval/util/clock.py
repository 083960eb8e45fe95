"""RetryClock: when a stored retry falls due, measured on the monotonic clock.

A failed try stores the wall-clock instant of the next one on its batch (`next_attempt_at`,
`next_delivery_at`): `batch ID`, the page and a restart read it. The wall clock steps,
though (an NTP correction, a VM restored from a snapshot, an operator's fix): stepped back
an hour, an instant stored a minute ahead is an hour and a minute away. So the process that
stores an instant keeps its monotonic twin, and while the stored instant is still the one
it wrote, only the twin decides. An instant it did not write (before a restart, by another
process, or re-armed by `check --repair`) is trusted only as far as the longest delay the
schedule could have given it: further ahead than that, the clock stepped back since it was
written, and the try is due now.

Backoff: the waits of a step that failed on storage (a full disk) and has nothing stored
to wait on: it is tried again after 1 s, 2 s, ... up to a minute, never every tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from .timestamps import utcnow

# a twin past its instant by this much is forgotten: its batch ended or was not visited
# since, and the stored instant alone gives the same answer unless the clock stepped back
# by more than this meanwhile
FORGET_AFTER = 3600.0
FIRST_SWEEP = 1024  # twins kept before the first sweep; then twice the count left


class RetryClock:
    """The monotonic twins of the stored instants this process wrote (thread-safe)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._twins: dict[str, tuple[datetime, float]] = {}
        self._sweep_at = FIRST_SWEEP

    def schedule(self, key: str, delay: timedelta) -> datetime:
        """The wall-clock instant to store for a try `delay` from now; its twin is kept."""
        at = utcnow() + delay
        due = self._monotonic() + delay.total_seconds()
        with self._lock:
            self._twins[key] = (at, due)
            if len(self._twins) > self._sweep_at:
                self._forget_old()
        return at

    def seconds_left(self, key: str, stored: datetime | None, longest: float) -> float:
        """Seconds until the try stored for `key` is due (not positive: due now). `longest`:
        the largest delay the schedule could have stored (the bound for a stranger's)."""
        if stored is None:
            return 0.0
        with self._lock:
            twin = self._twins.get(key)
            if twin is not None and twin[0] == stored:
                return twin[1] - self._monotonic()
            self._twins.pop(key, None)  # rewritten elsewhere: the stored instant decides
        left = (stored - utcnow()).total_seconds()
        return 0.0 if left > longest else left

    def is_due(self, key: str, stored: datetime | None, longest: float) -> bool:
        """Whether the try stored for `key` may be made now."""
        return self.seconds_left(key, stored, longest) <= 0

    def _forget_old(self) -> None:
        horizon = self._monotonic() - FORGET_AFTER
        for key in [k for k, (_, due) in self._twins.items() if due < horizon]:
            del self._twins[key]
        self._sweep_at = max(FIRST_SWEEP, 2 * len(self._twins))


class Backoff:
    """Waits after failures that have no stored schedule (a full disk refused a step): the
    first `first` seconds, doubling to `cap`, on the monotonic clock, in this process only;
    a success forgets them. Thread-safe."""

    def __init__(
        self,
        first: float = 1.0,
        cap: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first = first
        self.cap = cap
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._failed: dict[str, tuple[int, float]] = {}  # key -> (failures in a row, due)

    def failed(self, key: str) -> tuple[int, float]:
        """Count one more failure of `key`: (failures in a row, seconds until the next try)."""
        with self._lock:
            count = self._failed.get(key, (0, 0.0))[0] + 1
            wait = min(self.cap, self.first * 2 ** (count - 1))
            self._failed[key] = (count, self._monotonic() + wait)
            if len(self._failed) > FIRST_SWEEP:  # keys that never succeeded (a file gone)
                horizon = self._monotonic() - FORGET_AFTER
                self._failed = {k: v for k, v in self._failed.items() if v[1] >= horizon}
        return count, wait

    def seconds_left(self, key: str) -> float:
        """Seconds until `key` may be tried again (not positive: now)."""
        with self._lock:
            entry = self._failed.get(key)
        return 0.0 if entry is None else entry[1] - self._monotonic()

    def ready(self, key: str) -> bool:
        """Whether `key` may be tried now (True unless it failed and its wait is not over)."""
        return self.seconds_left(key) <= 0

    def succeeded(self, key: str) -> None:
        """Forget the failures of `key`."""
        with self._lock:
            self._failed.pop(key, None)
