"""Attempts: the one place that decides retries, of forge work and of report delivery.

Nothing sleeps or loops on a failure: each try is one visit. A failed try is recorded on
the batch (`attempts`, `last_error`, `next_attempt_at` for forge work; `delivery_attempts`,
`last_delivery_error`, `next_delivery_at` for delivery), and the worker comes back when
the stored instant is due. The delay is exponential with full jitter (AWS's "full
jitter"), computed by tenacity's `wait_random_exponential`, so many batches failing
together do not come back together.

Forge work: an answer that retrying cannot change (a 4xx other than 404, 408, 409 and 429
to a write, 413 included), or failures past `SAAS_EVAL_MAX_ATTEMPTS` visits in a row, end
the batch `failed` (lifecycle.py). 401/403 are the operator's token, and a 4xx to a read
is a proxy's or the forge's trouble, not the batch's: they only count as failed visits.

Delivery: every failure is tried again, up to `SAAS_EVAL_DELIVERY_MAX_ATTEMPTS`; then the
report waits in `outbox/undelivered/` for an operator. A manual re-delivery is an extra try:
it does not use up an automatic attempt or move the next one.

Whether a stored try is due is asked here only (`is_due`, `retry_in`, `delivery_due`): the
wait is measured on the monotonic clock while the process runs (clock.py), so a wall clock
stepped back does not hold a batch. A visit that storage refused (a full disk: nothing can
be stored) waits in this process (`storage_refused`, clock.Backoff), never a tick.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from tenacity import RetryCallState, wait_exponential, wait_random_exponential

from ..errors import DeliveryError, ForgeAuthError, ForgeError, ForgePermanent
from ..models import BatchRecord, BatchStatus
from ..store import Store
from ..util.clock import Backoff, RetryClock
from ..util.timestamps import rfc3339

log = logging.getLogger("dropbox_eval")
RETRYABLE_4XX = frozenset({404, 408, 409, 429})
READS = frozenset({"GET", "HEAD"})
MAX_DELIVERY_DELAY = 6 * 3600.0


def next_delay(attempts: int, base: float, cap: float) -> timedelta:
    """The wait before try `attempts + 1`: random in [0, longest_delay(...)]."""
    wait = wait_random_exponential(multiplier=base, max=cap)
    return timedelta(seconds=float(wait(_after(attempts))))


def longest_delay(attempts: int, base: float, cap: float) -> float:
    """The most `next_delay` can give, in seconds: min(cap, base x 2^(attempts-1))."""
    return float(wait_exponential(multiplier=base, max=cap)(_after(attempts)))


def _after(attempts: int) -> RetryCallState:
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = max(1, attempts)
    return state


def is_permanent(error: ForgeError) -> bool:
    """The same request will get the same answer: retrying cannot help this batch."""
    if isinstance(error, ForgeAuthError) or not isinstance(error, ForgePermanent):
        return False
    if error.method in READS:  # a proxy refusing a listing says nothing about the batch
        return False
    return error.status is not None and error.status not in RETRYABLE_4XX


class Attempts:
    """Records tries of forge work and of delivery on the batch, and decides the next."""

    def __init__(
        self,
        store: Store,
        *,
        base: float,
        cap: float,
        max_attempts: int,
        delivery_base: float,
        delivery_max_attempts: int,
    ) -> None:
        self.store = store
        self.base = base
        self.cap = cap
        self.max_attempts = max_attempts
        self.delivery_base = delivery_base
        self.delivery_max_attempts = delivery_max_attempts
        self.forge_clock = RetryClock()  # next_attempt_at's monotonic twins
        self.delivery_clock = RetryClock()  # next_delivery_at's
        self.storage_waits = Backoff()  # batch id -> its visits that storage refused

    def retry_in(self, batch: BatchRecord) -> float:
        """Seconds until forge work on the batch may be tried again (not positive: now)."""
        longest = longest_delay(batch.attempts, self.base, self.cap)
        stored = self.forge_clock.seconds_left(batch.batch_id, batch.next_attempt_at, longest)
        return max(stored, self.storage_waits.seconds_left(batch.batch_id))

    def is_due(self, batch: BatchRecord) -> bool:
        """Whether forge work on the batch may be tried now."""
        return self.retry_in(batch) <= 0

    def delivery_due(self, batch: BatchRecord) -> bool:
        """Whether the next automatic delivery may be tried now (False once none is left)."""
        if batch.delivery_attempts == 0:
            return True
        if batch.next_delivery_at is None:
            return False
        longest = longest_delay(batch.delivery_attempts, self.delivery_base, MAX_DELIVERY_DELAY)
        return self.delivery_clock.is_due(batch.batch_id, batch.next_delivery_at, longest)

    def failed(self, batch_id: str, error: ForgeError) -> str | None:
        """Store a failed visit; returns why the batch must now fail, or None to retry."""
        batch = self.store.get_batch(batch_id)
        attempts = batch.attempts + 1
        self.store.update_batch(
            batch_id,
            attempts=attempts,
            last_error=str(error),
            next_attempt_at=self.forge_clock.schedule(
                batch_id, next_delay(attempts, self.base, self.cap)
            ),
        )
        if is_permanent(error):
            return f"the forge refused the request: {error}"
        if attempts >= self.max_attempts:
            return f"the forge failed {attempts} visits in a row; last: {error}"
        return None

    def storage_refused(self, batch_id: str) -> None:
        """A visit failed on storage: no schedule can be stored, so this process waits
        before the next one (1 s doubling to a minute)."""
        self.storage_waits.failed(batch_id)

    def succeeded(self, batch: BatchRecord) -> None:
        """Forget earlier failures once a visit worked (one write, only when needed). A
        batch that has ended keeps them: they say how it ended (a visit that found it ended
        and did nothing is no success)."""
        self.storage_waits.succeeded(batch.batch_id)
        if batch.attempts or batch.next_attempt_at is not None:
            self.store.update_batch(
                batch.batch_id, when=self._may_forget, attempts=0, next_attempt_at=None
            )

    def _may_forget(self, batch: BatchRecord) -> bool:
        """Checked under the record's lock, so a visit that failed meanwhile wins: a batch
        that ended, or that failed its last allowed visit, keeps its count."""
        return batch.status == BatchStatus.RUNNING and batch.attempts < self.max_attempts

    def delivery_failed(self, batch: BatchRecord, error: DeliveryError, *, manual: bool) -> str:
        """Store a failed delivery; returns what happens next, in words for the log, the
        page and `batch ID` ("attempt 3 of 8 failed: ...; next try at ...")."""
        limit = self.delivery_max_attempts
        if manual:  # an extra try: the automatic schedule stays as it was
            message = f"manual re-delivery failed: {error}"
            self.store.update_batch(batch.batch_id, last_delivery_error=message)
            return _manual_words(message, batch.next_delivery_at)
        attempts = batch.delivery_attempts + 1
        next_at = None
        if attempts < limit:
            delay = next_delay(attempts, self.delivery_base, MAX_DELIVERY_DELAY)
            next_at = self.delivery_clock.schedule(batch.batch_id, delay)
        message = f"attempt {attempts} of {limit} failed: {error}"
        self.store.update_batch(
            batch.batch_id,
            delivery_attempts=attempts,
            last_delivery_error=message,
            next_delivery_at=next_at,
        )
        return _next_words(message, next_at, batch.batch_id)


def _manual_words(message: str, next_at: datetime | None) -> str:
    """After a manual try: what the schedule does, and where to look, never the same
    command again (it would fail the same way)."""
    schedule = f"next try at {rfc3339(next_at)}" if next_at else "no automatic try left"
    return (
        f"{message}; {schedule}; the report waits in outbox/undelivered/. Fix what the error "
        "names first; a command run with other settings than the service's (callback policy, "
        "folders) fails where the service would not: `dropbox-eval status` says so, and "
        "`--env-file` runs it with the service's"
    )


def _next_words(message: str, next_at: datetime | None, batch_id: str) -> str:
    if next_at is None:
        return (
            f"{message}; no automatic try left: the report waits in outbox/undelivered/ "
            f"(re-send with `dropbox-eval emit {batch_id} --force`)"
        )
    return f"{message}; next try at {rfc3339(next_at)}"
