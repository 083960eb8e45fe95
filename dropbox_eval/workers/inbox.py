"""InboxWorker: ready files -> intake (read, check, record, receipt), several at a time.

Ready files wait in a line per client (its inbox folder; the files at the top of the inbox
share one), served in weighted turns (util/roundrobin.py, the forge scheduler's rule and
`SAAS_EVAL_CLIENT_WEIGHTS`), and a file is handed to the pool only when a worker is free:
so one client's backlog delays another client's next drop by at most one turn per client.
At most `SAAS_EVAL_INBOX_CLIENT_BACKLOG` files of one client are tracked at once; the rest
stay on disk, looked for again by a rescan once that client is down to half of it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..inbox import Inbox, ReadinessTracker, is_candidate_name
from ..inbox.mounts import choose_polling
from ..inbox.watcher import InboxWatcher
from ..util.keyedpool import KeyedPool
from ..util.roundrobin import RoundRobin
from .guard import FAST_TICK_SECONDS, TICK_SECONDS, Report, guarded

BUSY_RETRY_SECONDS = 1.0  # a file held by another process or node: looked at again after
# Files taken at once. An intake spends most of its time in fsync, which lets the GIL go;
# with 8 in flight the store's group commit takes ~2.5 drops per write (4: ~1.6), so a
# drop costs fewer fsyncs to its receipt (bench/disk.py: 3.2 -> 2.7) and less CPU.
INBOX_WORKERS = 8

if TYPE_CHECKING:
    from concurrent.futures import Future
    from pathlib import Path

    from ..config import Settings

log = logging.getLogger("dropbox_eval")


class InboxWorker:
    """Watches the inbox; a file is taken once at a time (a re-upload meanwhile waits)."""

    def __init__(
        self,
        inbox: Inbox,
        settings: Settings,
        stop: threading.Event,
        report: Report,
        *,
        polling: bool | None,
        wake: threading.Event | None = None,
    ) -> None:
        """`polling`: True or False as asked, None to poll only an inbox on a network or
        FUSE filesystem (decided now, and again whenever the inbox folder is replaced).
        `wake`: set to look at once (a resume). The inbox's `paused` holds files back."""
        self.inbox = inbox
        self.settings = settings
        self.stop = stop
        self.report = report
        self.choice = polling
        self.polling, self.polling_note = choose_polling(polling, inbox.root)
        self.wake = wake or threading.Event()
        self.tracker = ReadinessTracker(
            settings.quiet_period,
            group_of=self.client_of,
            per_group=settings.inbox_client_backlog,
        )
        weights = settings.weights
        # a few ready files per client are enough to keep every worker busy
        self.ready_files: RoundRobin[Path] = RoundRobin(
            lambda client: weights.get(client, 1), bound=INBOX_WORKERS
        )
        self._queued: set[Path] = set()
        self._running = 0  # files handed to the pool and not done yet
        self._again: dict[Path, float] = {}  # busy files -> when to look at them again
        self._lock = threading.Lock()
        self.pool = KeyedPool(INBOX_WORKERS, "inbox")
        self.watcher = InboxWatcher(
            inbox.root,
            self.offer,
            self.wake,
            on_renamed=lambda path: self.offer(path, renamed=True),
            polling=self.polling,
            decide=self.decide_polling,
        )

    def run(self) -> None:
        """Watch and take files until stopped; a missing inbox folder is waited out."""
        next_scan = time.monotonic()
        try:
            while not self.stop.is_set():
                if self.watcher.keep() is None:
                    if time.monotonic() >= next_scan:
                        self.rescan()
                        next_scan = time.monotonic() + self.settings.rescan_interval
                    if self.inbox.paused() is None:  # paused: files wait, still tracked
                        self.take_ready()
                self.wake.wait(FAST_TICK_SECONDS if self.pending() else TICK_SECONDS)
                self.wake.clear()
        finally:
            self.watcher.stop()

    def waiting(self) -> str | None:
        """What intake waits for (the inbox folder is missing or not a folder), or None."""
        problem = self.watcher.problem
        return None if problem is None else f"inbox {self.inbox.root}: {problem}"

    def close(self) -> None:
        """Let the files being taken finish (after the last run)."""
        self.pool.shutdown(wait=True)

    def log_polling(self) -> None:
        """Say why the inbox is polled, or that a share is not (nothing on a local disk)."""
        if self.polling_note:
            log.log(logging.INFO if self.polling else logging.WARNING, "%s", self.polling_note)

    def decide_polling(self) -> bool:
        """Poll or not, again: the watcher asks when the inbox folder was replaced (a share
        mounted over it, or unmounted); a change is logged."""
        before = (self.polling, self.polling_note)
        self.polling, self.polling_note = choose_polling(self.choice, self.inbox.root)
        if (self.polling, self.polling_note) != before:
            self.log_polling()
            if self.polling_note is None:
                how = "polling (as asked)" if self.polling else "inotify"
                log.info("inbox %s is on a local filesystem now: %s", self.inbox.root, how)
        return self.polling

    def client_of(self, path: Path) -> str:
        """The line a file waits in: its client folder; "" for the top of the inbox."""
        try:
            return self.inbox.client_folder(path) or ""
        except ValueError:  # not below the inbox: no candidate ever is
            return ""

    def pending(self) -> int:
        """Files tracked, waiting for a worker or being taken (and 1 while a client's
        files beyond its backlog wait on disk for a rescan)."""
        with self._lock:
            running = self._running
        overflow = 1 if self.tracker.overflowed() else 0
        return self.tracker.pending() + len(self.ready_files) + running + overflow

    def offer(self, path: Path, *, renamed: bool = False) -> None:
        """Called from the observer thread for every event path: keep candidates only.

        `renamed`: a rename into place from a temporary or hidden name, so the file is
        complete and is read at the next look, without the quiet period.
        """
        if not is_candidate_name(self.inbox.root, path):
            return
        if renamed:
            self.tracker.renamed(path)
        else:
            self.tracker.changed(path)

    def rescan(self) -> None:
        """Offer every candidate present now (events can be lost)."""
        for path in self.inbox.scan():
            self.tracker.touch(path)

    def take_ready(self) -> list[Future[Any]]:
        """Line up the ready files by client, and hand the next ones by the turns to the
        pool, one per free worker (called from one thread: the worker's, or `--once`)."""
        if self.tracker.refill_due():
            self.rescan()
        self._due_again()
        for path in self.tracker.ready(wanted=self._has_room):
            if path in self._queued:  # changed while waiting (a re-upload): look again later
                self.tracker.touch(path)
            else:
                self.ready_files.push(self.client_of(path), path)
                self._queued.add(path)
        started = []
        while self.ready_files and self._claim_worker():
            _client, path = self.ready_files.pop()
            self._queued.discard(path)
            future = self.pool.submit([str(path)], self._take, path)
            if future is None:  # changed while being taken (a re-upload): look again later
                self._done()
                self.tracker.touch(path)
                continue
            started.append(future)
        return started

    def _has_room(self, path: Path) -> bool:
        return not self.ready_files.full(self.client_of(path))

    def _claim_worker(self) -> bool:
        """Take a free worker's place for the next file; False when none is free."""
        with self._lock:
            if self._running >= INBOX_WORKERS:
                return False
            self._running += 1
            return True

    def _done(self) -> None:
        with self._lock:
            self._running -= 1

    def _take(self, path: Path) -> None:
        try:
            outcome = guarded(f"file {path}", self.report, self.inbox.process, path)
        finally:
            self._done()
            self.wake.set()
        if outcome is not None and outcome.document.get("reason") == "busy":
            self._look_again(path)

    def _look_again(self, path: Path) -> None:
        """A file another process or node holds is looked at again soon, not only at the
        next rescan: if its holder dies, its lease lapses and this node files it."""
        with self._lock:
            self._again[path] = time.monotonic() + BUSY_RETRY_SECONDS

    def _due_again(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [path for path, at in self._again.items() if at <= now]
            for path in due:
                del self._again[path]
        for path in due:
            self.tracker.touch(path)
