"""The service's workers: file intake, forge work and report delivery, each on its own
thread, so one slow peer delays nobody else.

- InboxWorker: watches the inbox and takes each ready file in a small pool; a client whose
  batch is large or whose repo is slow holds one pool thread, not the inbox.
- ForgeWorker: every poll interval, ends batches that are due (cancel, deadline), resumes
  unfinished intakes, and polls each repo once, repos in parallel.
- DeliveryWorker: every tick, delivers the due reports in parallel, at most one delivery
  per destination host at a time, so a callback that never answers holds one thread.

Nothing retries inside a worker: each try of a forge call or a delivery is one visit, and
the schedule stored on the batch decides the next (schedule.py). No loop sleeps longer
than a tick, so a stop request is seen within a second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .app import App
from .delivery import destination
from .errors import DeliveryError, DropboxEvalError, ForgeError
from .inbox import ReadinessTracker, is_candidate_name
from .inbox.watcher import InboxWatcher
from .models import BatchStatus
from .schedule import is_due
from .scout import ChangeScout, Visit

log = logging.getLogger("dropbox_eval")
TICK_SECONDS = 1.0
FAST_TICK_SECONDS = 0.05
POOL_SIZE = 4
Report = Callable[[str, Exception], None]


def guarded(what: str, report: Report, step: Callable[..., Any], *args: Any) -> Any:
    """Run one step; a failure is logged and reported, never fatal to the worker."""
    try:
        return step(*args)
    except DeliveryError:
        pass  # logged and scheduled by the delivery stage
    except DropboxEvalError as exc:
        log.warning("%s: %s", what, exc)
        report(what, exc)
    except Exception as exc:  # noqa: BLE001 - a worker must survive any single step
        log.exception("%s: unexpected error", what)
        report(what, exc)
    return None


class InboxWorker:
    """Ready files -> intake, several at a time."""

    def __init__(self, app: App, stop: threading.Event, report: Report, *, polling: bool) -> None:
        self.app = app
        self.stop = stop
        self.report = report
        self.polling = polling
        self.wake = threading.Event()
        self.tracker = ReadinessTracker(app.settings.quiet_period)
        self.pool = ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="inbox")
        self.in_flight: set[Path] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        """Watch and take files until stopped."""
        watcher = InboxWatcher(
            self.app.inbox.root,
            self.offer,
            self.wake,
            on_renamed=lambda path: self.offer(path, renamed=True),
            polling=self.polling,
        )
        watcher.start()
        try:
            self.rescan()
            next_scan = time.monotonic() + self.app.settings.rescan_interval
            while not self.stop.is_set():
                if time.monotonic() >= next_scan:
                    self.rescan()
                    next_scan = time.monotonic() + self.app.settings.rescan_interval
                self.take_ready()
                self.wake.wait(FAST_TICK_SECONDS if self.tracker.pending() else TICK_SECONDS)
                self.wake.clear()
        finally:
            watcher.stop()
            self.pool.shutdown(wait=True)

    def offer(self, path: Path, *, renamed: bool = False) -> None:
        """Called from the observer thread for every event path: keep candidates only.

        `renamed`: a rename into place from a temporary or hidden name, so the file is
        complete and is read at the next look, without the quiet period.
        """
        if not is_candidate_name(self.app.inbox.root, path):
            return
        if renamed:
            self.tracker.renamed(path)
        else:
            self.tracker.changed(path)

    def rescan(self) -> None:
        """Offer every candidate present now (events can be lost)."""
        for path in self.app.inbox.scan():
            self.tracker.touch(path)

    def take_ready(self) -> list[Future[Any]]:
        """Hand each ready file not already being taken to the pool."""
        started = []
        for path in self.tracker.ready():
            with self._lock:
                busy = path in self.in_flight
                self.in_flight.add(path)
            if busy:  # changed while being taken (a re-upload): look again afterwards
                self.tracker.touch(path)
                continue
            started.append(self.pool.submit(self._take, path))
        return started

    def _take(self, path: Path) -> None:
        try:
            guarded(f"file {path}", self.report, self.app.inbox.process, path)
        finally:
            with self._lock:
                self.in_flight.discard(path)
            self.wake.set()


class ForgeWorker:
    """Cancel/expire, resumed intakes and polling, repo by repo in parallel."""

    def __init__(
        self,
        app: App,
        stop: threading.Event,
        report: Report,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.stop = stop
        self.report = report
        self.on_full = on_full  # the state check, run before each full reconciliation
        self.cycles = 0
        self.pool = ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="forge")
        self.busy: set[str] = set()  # repos whose last visit is still running
        self._lock = threading.Lock()
        # one repo per batch: a cross-repo search finds the repos that changed
        self.scout = None if app.settings.repo else ChangeScout(app)

    def run(self, on_cycle: Callable[[], None]) -> None:
        """A cycle every poll interval until stopped; repos a webhook named at once."""
        nudges = self.app.nudges
        try:
            next_cycle = time.monotonic()
            while not self.stop.is_set():
                if time.monotonic() >= next_cycle:
                    guarded("poll cycle", self.report, self.cycle)
                    on_cycle()
                    next_cycle = time.monotonic() + self.app.settings.poll_interval
                else:
                    guarded("webhook poll", self.report, self.cycle, nudges.take())
                nudges.wake.wait(min(TICK_SECONDS, max(0.0, next_cycle - time.monotonic())))
                nudges.wake.clear()
        finally:
            self.pool.shutdown(wait=True)

    def cycle(self, only: set[str] | None = None) -> list[Future[Any]]:
        """Visit every due running batch (of the repos `only` names, for a webhook's nudge:
        an incremental poll outside the cycle); returns the repo visits started."""
        if only is not None and not only:
            return []
        begun = time.monotonic()
        full = False
        if only is None:
            self.cycles += 1
            full = (self.cycles - 1) % self.app.settings.full_poll_every == 0
            if full and self.cycles > 1 and self.on_full is not None:  # the start ran it
                guarded("state check", self.report, self.on_full)
        by_repo: dict[str, list[str]] = {}
        for row in self.app.store.list_batches(live_only=True):
            if row["status"] != BatchStatus.RUNNING or self.stop.is_set():
                continue
            if only is not None and str(row["repo"]).casefold() not in only:
                continue
            by_repo.setdefault(str(row["repo"]), []).append(str(row["batch_id"]))
        plan: dict[str, Visit] | None = None
        if only is None and self.scout is not None and len(by_repo) > 1:  # else one listing
            plan = self._scouted(by_repo, full)  # {} when nothing needs a visit
        if plan is None:
            plan = {repo: Visit(full=full) for repo in by_repo}
        started = []
        for repo, visit in plan.items():
            with self._lock:
                if repo in self.busy:
                    if only is not None:  # a webhook's news waits for the visit in flight
                        self.app.nudges.add(repo, wake=False)
                    continue  # a repo that hangs holds its own visit, nobody else's
                self.busy.add(repo)
            started.append(self.pool.submit(self._visit_repo, repo, by_repo[repo], visit))
        if only is None:  # a poll cycle, not a webhook's nudge
            self.app.metrics.time_cycle(started, begun)
        return started

    def _scouted(self, by_repo: dict[str, list[str]], full: bool) -> dict[str, Visit] | None:
        """The search's plan; None (every repo listed) when the search failed."""
        assert self.scout is not None
        try:
            return self.scout.plan(by_repo, full)
        except ForgeError as exc:
            log.warning("cross-repo search failed, listing every repo: %s", exc)
            self.report("search", exc)
            return None

    def _visit_repo(self, repo: str, batch_ids: list[str], visit: Visit) -> None:
        try:
            guarded(f"repo {repo}", self.report, self.visit_repo, batch_ids, visit)
        finally:
            with self._lock:
                self.busy.discard(repo)

    def visit_repo(self, batch_ids: list[str], visit: Visit) -> None:
        """End or resume each due batch of one repo, then poll the rest in one listing."""
        lifecycle, store = self.app.lifecycle, self.app.store
        to_poll: list[str] = []
        failing: list[str] = []  # batches whose earlier visits failed: reset once this works
        for batch_id in batch_ids:
            batch = store.get_batch(batch_id)
            if lifecycle.end_if_due(batch_id, batch):
                continue
            if batch.status != BatchStatus.RUNNING or not is_due(batch):
                continue
            opened: int | None = 0
            if not batch.intake_done:
                opened = lifecycle.visit(batch_id, self.app.intake.open_issues, batch_id)
            if opened is not None:  # a failed intake visit counts once, not twice
                to_poll.append(batch_id)
                if batch.attempts or batch.next_attempt_at is not None:
                    failing.append(batch_id)
        if not to_poll:
            return
        try:
            self.app.poller.poll_batches(
                to_poll,
                full=visit.full,
                probe=visit.probe,
                listed=visit.listed,
                open_count=visit.open_count,
            )
        except ForgeError as exc:
            for batch_id in to_poll:  # the listing is shared: each batch counts the visit
                lifecycle.visit(batch_id, _raise, exc)
        else:  # no batch read again when none had failed (the common, idle case)
            for batch_id in failing:
                lifecycle.schedule.succeeded(store.get_batch(batch_id))


def _raise(error: Exception) -> None:
    raise error


class DeliveryWorker:
    """Due reports -> outbox or callback, one delivery per destination at a time."""

    def __init__(self, app: App, stop: threading.Event, report: Report) -> None:
        self.app = app
        self.stop = stop
        self.report = report
        self.pool = ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="delivery")
        self.busy: set[str] = set()  # batch ids and callback hosts being delivered to
        self._lock = threading.Lock()

    def run(self) -> None:
        """A pass every tick until stopped."""
        try:
            while not self.stop.is_set():
                guarded("delivery", self.report, self.deliver_due)
                self.stop.wait(TICK_SECONDS)
        finally:
            self.pool.shutdown(wait=True)

    def deliver_due(self) -> list[Future[Any]]:
        """Start the delivery of every due report whose destination is free."""
        started = []
        for row in self.app.store.list_batches(live_only=True):
            if row["status"] == BatchStatus.RUNNING or self.stop.is_set():
                continue
            batch = self.app.store.get_batch(str(row["batch_id"]))
            if batch.emitted_at is not None:  # a crash came between emit and archiving
                self.app.store.archive(batch)
                continue
            if not self.app.delivery.is_due(batch):
                continue
            host = destination(batch)
            with self._lock:
                if batch.batch_id in self.busy or host in self.busy:
                    continue
                self.busy.add(batch.batch_id)
                if host != "outbox":  # files are never slow: no need to take turns
                    self.busy.add(host)
            started.append(self.pool.submit(self._deliver, batch.batch_id, host))
        return started

    def _deliver(self, batch_id: str, host: str) -> None:
        try:
            guarded(f"batch {batch_id}", self.report, self.app.delivery.emit, batch_id)
        finally:
            with self._lock:
                self.busy.discard(batch_id)
                if host != "outbox":
                    self.busy.discard(host)
