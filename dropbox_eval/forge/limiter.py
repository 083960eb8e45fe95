"""The forge's in-flight budget, found rather than fixed: additive increase while the
latency stays near the lowest seen, multiplicative decrease on rising latency, 5xx, 429 and
timeouts, and a pause for a `Retry-After` (AIMD, as TCP and Netflix's concurrency-limits
do). The sandbox forge never errors under load, so latency alone must be able to stop the
climb.

"Near the lowest" compares the recent latency (a moving average: one slow call is not a
trend, one quick answer such as a 404 is no floor) with the lowest it has been, the
forge's floor. A floor that drifted up with the calls would let the budget climb with the
queue it builds, so the floor moves only when it is measured again, as BBR does: when the
recent latency has not come near it for `PROBE_EVERY` seconds, the budget is halved for
two round trips (`probe`), the calls then meet no queue, and their latency is the floor
from then on. A forge that queues shows its old floor again;
one that has become slower for good shows its new one, and the budget climbs from there.

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

TOLERANCE = 2.0  # a recent latency up to this multiple of the lowest is "near" it
DECREASE = 0.8  # the factor of a backoff on rising latency
OVERLOAD_DECREASE = 0.5  # the factor of a backoff on 5xx, 429 or a timeout
SMOOTHING = 0.25  # the weight of the newest call in the recent latency
PROBE_EVERY = 10.0  # seconds without a call near the floor before it is measured again
NEAR_FLOOR = 1.25  # a latency up to this multiple of the floor confirms it


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
        self._whole_ceiling = self.ceiling  # the forge's, shared by every node (`share`)
        self._limit = float(min(max(initial, self.floor), self.ceiling))
        self._lowest: float | None = None  # the forge's floor
        self._confirmed_at = clock()  # when a call last came near the floor
        self._probe: _Probe | None = None
        self._recent: float | None = None
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
        """The forge's floor: the lowest the recent latency has been since the last probe,
        or what that probe measured."""
        return self._lowest

    def paused_for(self) -> float:
        """Seconds left of a pause the forge asked for (Retry-After); 0 when none."""
        return max(0.0, self._paused_until - self._clock())

    def share(self, nodes: int) -> None:
        """This node's part of the forge's ceiling when `nodes` nodes call the same forge:
        the sum over the nodes stays the forge's own, never multiplied by their number."""
        with self._lock:
            before = self.limit
            self.ceiling = max(self.floor, self._whole_ceiling // max(1, nodes))
            self._limit = min(self._limit, float(self.ceiling))
            if self._probe is not None:
                self._probe.limit = min(self._probe.limit, float(self.ceiling))
            if self._recover_to is not None:
                self._recover_to = min(self._recover_to, float(self.ceiling))
            after = self.limit
        if after != before and self._on_change is not None:
            self._on_change(after)

    def record(self, outcome: Outcome, in_flight: int) -> None:
        """Learn from one finished call; `in_flight` counts it and the others still out."""
        with self._lock:
            before = self.limit
            now = self._clock()
            if outcome.retry_after:
                self._paused_until = max(self._paused_until, now + outcome.retry_after)
            if outcome.overloaded:
                if self._probe is not None:  # no floor to measure in an outage
                    self._limit, self._probe = self._probe.limit, None
                if self._recover_to is None:  # the first of an overload: where to get back
                    self._recover_to = self._limit * OVERLOAD_DECREASE
                self._decrease(OVERLOAD_DECREASE, now, outcome.latency)
            else:
                self._learn_latency(outcome.latency, in_flight, now)
            after = self.limit
        if after != before and self._on_change is not None:
            self._on_change(after)

    def _learn_latency(self, latency: float, in_flight: int, now: float) -> None:
        recent = latency if self._recent is None else self._recent
        self._recent = recent = recent + (latency - recent) * SMOOTHING
        if self._probe is not None:
            self._probing(now)
            return
        if self._lowest is None or recent < self._lowest:
            self._lowest = recent  # of the average: one quick call (a 404) is no floor
        if recent <= NEAR_FLOOR * self._lowest:
            self._confirmed_at = now
        elif now - self._confirmed_at > PROBE_EVERY:
            self._start_probe(latency, now)
            return
        if recent > TOLERANCE * self._lowest:
            self._recover_to = None
            self._decrease(DECREASE, now, latency)
        elif in_flight >= self._limit - 1:  # only a budget in use says anything about it
            self._limit = min(float(self.ceiling), self._limit + self._step())

    def _start_probe(self, latency: float, now: float) -> None:
        """Halve the budget for two round trips: the calls sent meanwhile meet no queue."""
        self._probe = _Probe(self._limit, now + 2 * max(latency, self._recent or 0.0))
        self._limit = max(float(self.floor), self._limit * 0.5)

    def _probing(self, now: float) -> None:
        """At the probe's end the recent latency, that of calls sent at half the budget,
        is the floor."""
        probe = self._probe
        assert probe is not None
        if now < probe.until:
            return
        self._probe = None
        self._lowest = self._recent
        self._confirmed_at = now
        self._limit = probe.limit  # the budget of before: the floor decides from here

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


@dataclass
class _Probe:
    """A measurement of the floor under way: the budget to go back to, and when it ends."""

    limit: float
    until: float
