"""OpenWorker: recorded batches -> their issues. The drop has its receipt already; here
each batch's issues are created, at most OPEN_PER_CLIENT batches of one client at a time,
every forge call waiting its client's turn at the scheduler. A batch whose visit failed is
offered again at the instant its stored schedule names (`retry_at`, an alarm), not at the
next poll cycle, so the forge's budget is in use again as soon as it may be."""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError
from ..models import BatchStatus
from ..util.keyedpool import KeyedPool
from .guard import Report, guarded

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..intake.opening import IssueOpener
    from ..lifecycle.ending import Lifecycle
    from ..store import Store

# 8 clients served at once, as many batches of one client as its burst needs to fill the
# forge's budget; the scheduler, not the thread count, keeps the clients' forge calls fair
OPEN_THREADS = 64
OPEN_PER_CLIENT = 8


class OpenWorker:
    """Opens batches handed over by the inbox, the API or a poll cycle's resume."""

    def __init__(
        self,
        store: Store,
        opener: IssueOpener,
        lifecycle: Lifecycle,
        report: Report,
        retry_at: Callable[[float, Callable[[], None]], None] | None = None,
    ) -> None:
        """`retry_at` calls back in so many seconds (the service's alarm); None: the poll
        cycle resumes a failed opening."""
        self.store = store
        self.opener = opener
        self.lifecycle = lifecycle
        self.report = report
        self.pool = KeyedPool(OPEN_THREADS, "open", per_group=OPEN_PER_CLIENT)
        self._started: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self.retry_at = retry_at

    def offer(self, batch_id: str, client_id: str) -> Future[Any] | None:
        """Open the batch's missing issues unless that is under way already."""
        future = self.pool.submit([batch_id], self._open, batch_id, group=client_id)
        if future is not None:
            with self._lock:
                self._started.add(future)
            future.add_done_callback(self._forget)
        return future

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every batch offered so far is open (or its visit failed)."""
        with self._lock:
            started = list(self._started)
        wait(started, timeout=timeout)

    def shutdown(self) -> None:
        """Let the batches being opened finish their step, then stop."""
        self.pool.shutdown(wait=True)

    def _open(self, batch_id: str) -> None:
        lifecycle = self.lifecycle
        opened = guarded(
            f"batch {batch_id}",
            self.report,
            lifecycle.visit,
            batch_id,
            self.opener.open_issues,
            batch_id,
        )
        if opened is None:  # the visit failed (a count of issues otherwise)
            self._schedule_retry(batch_id)

    def _schedule_retry(self, batch_id: str) -> None:
        """A failed visit left a next try on the record: come back then."""
        try:
            batch = self.store.get_batch(batch_id)
        except NotFoundError:  # archived meanwhile: nothing left to open
            return
        unfinished = batch.status == BatchStatus.RUNNING and not batch.intake_done
        if self.retry_at is None or not unfinished or batch.next_attempt_at is None:
            return
        seconds = self.lifecycle.attempts.retry_in(batch)

        def again() -> None:
            self.offer(batch_id, batch.client_id)

        self.retry_at(seconds, again)

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._started.discard(future)
