"""The durable retry schedule: every forge call or delivery is tried once per visit, and the
stored attempts decide the next visit.

A stage never sleeps or loops on a failure. It records the failure on the batch
(`attempts`, `last_error`, `next_attempt_at`), and the worker skips the batch until then.
An answer that retrying cannot change (a 4xx other than 404, 408, 409 and 429 to a write:
413 included), or a failure that repeats past `SAAS_EVAL_MAX_ATTEMPTS` visits, ends the
batch `failed` (lifecycle.py). 401/403 are the operator's token, and a 4xx to a read is a
proxy's or the forge's trouble, not the batch's: they only count as failed visits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .errors import ForgeAuthError, ForgeError, ForgePermanent
from .models import BatchRecord, utcnow
from .store import Store

RETRYABLE_4XX = frozenset({404, 408, 409, 429})
READS = frozenset({"GET", "HEAD"})


def backoff(attempts: int, base: float, cap: float) -> timedelta:
    """Exponential delay before visit `attempts + 1`: base, 2 x base, 4 x base ... cap."""
    return timedelta(seconds=min(base * 2 ** max(attempts - 1, 0), cap))


def is_permanent(error: ForgeError) -> bool:
    """The same request will get the same answer: retrying cannot help this batch."""
    if isinstance(error, ForgeAuthError) or not isinstance(error, ForgePermanent):
        return False
    if error.method in READS:  # a proxy refusing a listing says nothing about the batch
        return False
    return error.status is not None and error.status not in RETRYABLE_4XX


def is_due(batch: BatchRecord, now: datetime | None = None) -> bool:
    """Whether forge work on the batch may be tried now."""
    return batch.next_attempt_at is None or batch.next_attempt_at <= (now or utcnow())


class Schedule:
    """Records failed and successful visits of forge work on a batch."""

    def __init__(self, store: Store, *, base: float, cap: float, max_attempts: int) -> None:
        self.store = store
        self.base = base
        self.cap = cap
        self.max_attempts = max_attempts

    def failed(self, batch_id: str, error: ForgeError) -> str | None:
        """Store the failure; returns why the batch must now fail, or None to retry."""
        batch = self.store.get_batch(batch_id)
        attempts = batch.attempts + 1
        self.store.update_batch(
            batch_id,
            attempts=attempts,
            last_error=str(error),
            next_attempt_at=utcnow() + backoff(attempts, self.base, self.cap),
        )
        if is_permanent(error):
            return f"the forge refused the request: {error}"
        if attempts >= self.max_attempts:
            return f"the forge failed {attempts} visits in a row; last: {error}"
        return None

    def succeeded(self, batch: BatchRecord) -> None:
        """Forget earlier failures once a visit worked (one write, only when needed)."""
        if batch.attempts or batch.next_attempt_at is not None:
            self.store.update_batch(batch.batch_id, attempts=0, next_attempt_at=None)
