"""The forge's in-flight budget, found rather than fixed: additive increase while the
latency stays near the lowest seen, multiplicative decrease on rising latency, 5xx, 429 and
timeouts, and a pause for a `Retry-After` (AIMD, as TCP and Netflix's concurrency-limits
do). The sandbox forge never errors under load, so latency alone must be able to stop the
climb.

After an overload (5xx, 429, a timeout: often a restart or a short outage, not a slower
forge) the budget climbs back as TCP's slow start does: by one per good call, doubling
every round trip, until it is back at half the budget it had before the overload, then by
one per round trip again. Rising latency gets no slow start: the forge is busy, not gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

TOLERANCE = 2.0  # a latency up to this multiple of the lowest seen is "near" it
DECREASE = 0.8  # the factor of a backoff on rising latency
OVERLOAD_DECREASE = 0.5  # the factor of a backoff on 5xx, 429 or a timeout
DRIFT = 0.002  # how fast the lowest latency seen forgets (a slower forge becomes normal)


@dataclass(frozen=True)
class Outcome:
    """How one forge call went: its latency, and whether the forge said it was overloaded
    (5xx, 429, a timeout) and for how long it asked to be left alone."""

    latency: float
    overloaded: bool = False
    retry_after: float | None = None


class Limiter:
    """The number of forge calls allowed in flight; thread-safe."""

    def __init__(
        self,
        *,
        initial: int,
        floor: int = 1,
        ceiling: int = 64,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling)
        self._limit = float(min(max(initial, self.floor), self.ceiling))
        self._lowest: float | None = None
        self._recover_to: float | None = None  # slow start's end after an overload
        self._calm_after = 0.0  # no second decrease before the calls already out come back
        self._paused_until = 0.0
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        """The calls that may be in flight now."""
        return int(self._limit)

    @property
    def lowest_latency(self) -> float | None:
        """The lowest latency seen (drifting up slowly)."""
        return self._lowest

    def paused_for(self) -> float:
        """Seconds left of a pause the forge asked for (Retry-After); 0 when none."""
        return max(0.0, self._paused_until - self._clock())

    def record(self, outcome: Outcome, in_flight: int) -> None:
        """Learn from one finished call; `in_flight` counts it and the others still out."""
        with self._lock:
            before = self.limit
            now = self._clock()
            if outcome.retry_after:
                self._paused_until = max(self._paused_until, now + outcome.retry_after)
            if outcome.overloaded:
                if self._recover_to is None:  # the first of an overload: where to get back
                    self._recover_to = self._limit * OVERLOAD_DECREASE
                self._decrease(OVERLOAD_DECREASE, now, outcome.latency)
            else:
                self._learn_latency(outcome.latency, in_flight, now)
            after = self.limit
        if after != before and self._on_change is not None:
            self._on_change(after)

    def _learn_latency(self, latency: float, in_flight: int, now: float) -> None:
        lowest = self._lowest
        if lowest is None or latency < lowest:
            self._lowest = latency
            lowest = latency
        else:
            self._lowest = lowest + (latency - lowest) * DRIFT
        if latency > TOLERANCE * lowest:
            self._recover_to = None
            self._decrease(DECREASE, now, latency)
        elif in_flight >= self._limit - 1:  # only a budget in use says anything about it
            self._limit = min(float(self.ceiling), self._limit + self._step())

    def _step(self) -> float:
        if self._recover_to is not None and self._limit < self._recover_to:
            return min(1.0, self._recover_to - self._limit)
        self._recover_to = None
        return 1.0 / self._limit

    def _decrease(self, factor: float, now: float, latency: float) -> None:
        if now < self._calm_after:
            return
        self._limit = max(float(self.floor), self._limit * factor)
        self._calm_after = now + max(latency, self._lowest or 0.0)
