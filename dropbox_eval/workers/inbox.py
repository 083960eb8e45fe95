"""InboxWorker: ready files -> intake (read, check, record, receipt), several at a time."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..inbox import Inbox, ReadinessTracker, is_candidate_name
from ..inbox.mounts import choose_polling
from ..inbox.watcher import InboxWatcher
from ..util.keyedpool import KeyedPool
from .guard import FAST_TICK_SECONDS, POOL_SIZE, TICK_SECONDS, Report, guarded

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
        self.tracker = ReadinessTracker(settings.quiet_period)
        self.pool = KeyedPool(POOL_SIZE, "inbox")
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
                self.wake.wait(FAST_TICK_SECONDS if self.tracker.pending() else TICK_SECONDS)
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
        """Hand each ready file not already being taken to the pool."""
        started = []
        for path in self.tracker.ready():
            future = self.pool.submit([str(path)], self._take, path)
            if future is None:  # changed while being taken (a re-upload): look again later
                self.tracker.touch(path)
                continue
            started.append(future)
        return started

    def _take(self, path: Path) -> None:
        try:
            guarded(f"file {path}", self.report, self.inbox.process, path)
        finally:
            self.wake.set()
