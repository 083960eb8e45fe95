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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from .models import utcnow

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
