"""OpenWorker: recorded batches -> their issues. The drop has its receipt already; here
each batch's issues are created, at most OPEN_PER_CLIENT batches of one client at a time,
every forge call waiting its client's turn at the scheduler."""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Any

from ..app import App
from ..keyedpool import KeyedPool
from .guard import Report, guarded

OPEN_THREADS = 16
OPEN_PER_CLIENT = 2


class OpenWorker:
    """Opens batches handed over by the inbox, the API or a poll cycle's resume."""

    def __init__(self, app: App, report: Report) -> None:
        self.app = app
        self.report = report
        self.pool = KeyedPool(OPEN_THREADS, "open", per_group=OPEN_PER_CLIENT)
        self._started: set[Future[Any]] = set()
        self._lock = threading.Lock()

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
        intake, lifecycle = self.app.intake, self.app.lifecycle
        guarded(
            f"batch {batch_id}",
            self.report,
            lifecycle.visit,
            batch_id,
            intake.open_issues,
            batch_id,
        )

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._started.discard(future)
