"""Watchdog observer on the inbox; events are wake-ups that hand paths to the tracker.

Events are hints, never proof that a file is complete (the tracker decides that), and they
can be lost (inotify queue overflow, network shares that deliver none): the service also
rescans periodically. Two things make the watcher itself robust:

- Only changes are subscribed to (created, modified, attributes, moved, closed-after-write),
  so the service's own reads do not echo back as events.
- A supervisor thread notices when the observer stopped watching (the inbox folder was
  deleted and recreated, a share was remounted over it, the emitter thread died) and
  rebuilds it, then offers every file present so nothing waits for the next rescan.

`polling=True` (for NFS/SMB shares) uses watchdog's polling observer with `lstat` and a
listing that skips hidden entries, `accepted/`, `rejected/` and anything deeper than a client
folder: a symlink loop or a large history cannot make each poll walk without end.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from watchdog.events import (
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserverVFS

from .inbox import OUTCOME_DIRS, candidates

log = logging.getLogger("dropbox_eval")

WATCHED_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent, FileModifiedEvent, FileAttribEvent, FileMovedEvent, FileClosedEvent,
]
SUPERVISE_SECONDS = 1.0


class _Handler(FileSystemEventHandler):
    def __init__(self, on_path: Callable[[Path], None], wake: threading.Event) -> None:
        self.on_path = on_path
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        for raw in (getattr(event, "dest_path", ""), event.src_path):
            if raw:
                self.on_path(Path(os.fsdecode(raw)))
        self.wake.set()


class InboxWatcher:
    """Runs a (polling, for network shares) observer over the inbox, recursively."""

    def __init__(self, root: Path, on_path: Callable[[Path], None], wake: threading.Event,
                 *, polling: bool = False, poll_seconds: float = 1.0,
                 supervise_seconds: float = SUPERVISE_SECONDS) -> None:
        self.root = root
        self.on_path = on_path
        self.wake = wake
        self.polling = polling
        self.poll_seconds = poll_seconds
        self.supervise_seconds = supervise_seconds
        self.restarts = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._identity = _identity(root)
        self.observer = self._build()
        self._supervisor = threading.Thread(target=self._supervise, name="inbox-supervisor",
                                            daemon=True)

    def start(self) -> None:
        """Start the observer thread and its supervisor."""
        with self._lock:
            self.observer.start()
        self._supervisor.start()

    def stop(self) -> None:
        """Stop and join the supervisor and the observer thread."""
        self._stopping.set()
        if self._supervisor.is_alive():
            self._supervisor.join(timeout=5)
        with self._lock:
            _stop(self.observer)

    def healthy(self) -> bool:
        """Whether the observer is running and still watching the inbox folder we see now."""
        try:
            identity = _identity(self.root)
        except OSError:
            return False
        with self._lock:
            return identity == self._identity and _alive(self.observer)

    def _build(self) -> BaseObserver:
        observer: BaseObserver
        if self.polling:
            observer = PollingObserverVFS(os.lstat, _inbox_listdir(self.root),
                                          polling_interval=self.poll_seconds)
        else:
            observer = Observer()
        observer.daemon = True
        observer.schedule(_Handler(self.on_path, self.wake), str(self.root), recursive=True,
                          event_filter=WATCHED_EVENTS)
        return observer

    def _supervise(self) -> None:
        while not self._stopping.wait(self.supervise_seconds):
            try:
                self._supervise_once()
            except Exception:  # noqa: BLE001 - the supervisor must outlive any single failure
                log.exception("inbox watcher: supervision failed; rescans still run")

    def _supervise_once(self) -> None:
        try:
            identity = _identity(self.root)
        except OSError:
            return  # the folder is missing or the share unreachable: wait for it to return
        with self._lock:
            if self._stopping.is_set():
                return
            if identity == self._identity and _alive(self.observer):
                return
            log.warning("inbox watcher: %s stopped delivering events (folder replaced or "
                        "observer stopped); restarting it", self.root)
            _stop(self.observer)
            self._identity = identity
            self.observer = self._build()
            self.observer.start()
            self.restarts += 1
        for path in candidates(self.root):  # whatever arrived while nobody was watching
            self.on_path(path)
        self.wake.set()


def _identity(root: Path) -> tuple[int, int]:
    info = os.stat(root)
    return info.st_dev, info.st_ino


def _alive(observer: BaseObserver) -> bool:
    emitters = list(observer.emitters)
    return observer.is_alive() and bool(emitters) and all(e.is_alive() for e in emitters)


def _stop(observer: BaseObserver) -> None:
    observer.stop()
    if observer.is_alive():
        observer.join(timeout=5)


def _inbox_listdir(root: Path) -> Callable[[str | None], Iterator[os.DirEntry[str]]]:
    """A scandir for the polling observer that sees only what can hold candidates."""
    top = str(root)

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        folder = top if path is None else path
        relative = os.path.relpath(folder, top)
        depth = 0 if relative == "." else relative.count(os.sep) + 1
        if depth > 1:
            return iter(())
        with os.scandir(folder) as entries:
            kept = [e for e in entries
                    if not e.name.startswith(".")
                    and not (e.name in OUTCOME_DIRS and e.is_dir(follow_symlinks=False))]
        return iter(kept)

    return listdir
