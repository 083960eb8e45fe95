"""Watchdog observer on the inbox; events are wake-ups that hand paths to the tracker.

Events are hints, never proof that a file is complete (the tracker decides that), and they
can be lost (inotify queue overflow, network shares that deliver none): the service also
rescans periodically. One event is more than a hint: a move within the inbox from a name
that is not a candidate (`x.json.part`, `.x.json.AbC123`, `accepted/x.json`) to a candidate
name is an atomic rename into place, and an interrupted upload never renames, so it is
handed to `on_renamed` and the file is read without waiting for the quiet period. A rename
done as link + unlink (OpenSSH's server for WinSCP), a move in from outside the inbox (a
created event), a move between two candidate names and a move reported by watchdog for a
file inside a renamed folder (synthetic) are ordinary events. So are all moves reported by
the polling observer: it infers a move from an inode number seen under a new name in the
next listing, and a temporary file deleted and an unrelated file written in place under a
candidate name can share a reused inode within one poll; only inotify's rename events are
exact. Two things make the watcher itself robust:

- Only changes are subscribed to (created, modified, attributes, moved, closed-after-write),
  so the service's own reads do not echo back as events.
- On every tick of the inbox worker, `keep` notices when the observer stopped watching (the
  inbox folder was deleted and recreated, a share was remounted over it, the emitter
  thread died) and rebuilds it, then offers every file present so nothing waits for the
  next rescan. A missing inbox folder (a share not mounted yet) is a state to wait out.

`polling=True` (for network and FUSE shares, which the service detects with mounts.py) uses
watchdog's polling observer with `lstat` and a
listing that skips hidden entries, `accepted/`, `rejected/` and anything deeper than a client
folder: a symlink loop or a large history cannot make each poll walk without end.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from watchdog.events import (
    EVENT_TYPE_MOVED,
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

from ..protocol.namefilter import NAMES
from .scan import OUTCOME_DIRS, candidates, is_candidate_name

log = logging.getLogger("dropbox_eval")

WATCHED_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileAttribEvent,
    FileMovedEvent,
    FileClosedEvent,
]


class _Handler(FileSystemEventHandler):
    def __init__(
        self,
        root: Path,
        on_path: Callable[[Path], None],
        wake: threading.Event,
        on_renamed: Callable[[Path], None] | None = None,
    ) -> None:
        self.root = root
        self._prefix = f"{os.fsdecode(root)}/"
        self.on_path = on_path
        self.wake = wake
        self.on_renamed = on_renamed

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(getattr(event, "dest_path", ""))
        if self._filed_away(src) and (not dest or self._filed_away(dest)):
            return  # the service's own filing: receipts, error files, moved drops
        if self.on_renamed is not None and self._renamed_into_place(event, src, dest):
            self.on_renamed(Path(dest))
        else:
            for raw in (dest, src):
                if raw:
                    self.on_path(Path(raw))
        self.wake.set()

    def _filed_away(self, raw: str) -> bool:
        """Whether an event's path lies in an `accepted/` or `rejected/` folder: never a
        candidate, and each filing makes about five such events (on the string: this runs
        for every event)."""
        folders = raw[len(self._prefix) :].split("/")[:-1] if raw.startswith(self._prefix) else []
        return any(folder.casefold() in OUTCOME_DIRS for folder in folders)

    def _renamed_into_place(self, event: FileSystemEvent, src: str, dest: str) -> bool:
        """A real rename within the inbox from a non-candidate name to a candidate name."""
        if event.event_type != EVENT_TYPE_MOVED or event.is_synthetic or not (src and dest):
            return False
        source = Path(src)
        return (
            source.is_relative_to(self.root)
            and source != self.root
            and not is_candidate_name(self.root, source)
            and is_candidate_name(self.root, Path(dest))
        )


class InboxWatcher:
    """Runs a (polling, for network shares) observer over the inbox, recursively; `keep`,
    called on every tick of the inbox worker, keeps it on the folder that is there now."""

    def __init__(
        self,
        root: Path,
        on_path: Callable[[Path], None],
        wake: threading.Event,
        *,
        on_renamed: Callable[[Path], None] | None = None,
        polling: bool = False,
        decide: Callable[[], bool] | None = None,
        poll_seconds: float = 1.0,
    ) -> None:
        """`on_path` gets every path an event names (a wake-up); `on_renamed`, if given, gets
        the destination of a rename into place instead (inotify only, see the module
        docstring). `decide`, if given, says again whether to poll when the observer is
        rebuilt for a replaced inbox folder (a share mounted over it)."""
        self.root = root
        self.on_path = on_path
        self.on_renamed = on_renamed
        self.wake = wake
        self.polling = polling
        self.decide = decide
        self.poll_seconds = poll_seconds
        self.restarts = 0
        self._identity: tuple[int, int] | None = None
        self.observer: BaseObserver | None = None
        self.problem: str | None = None
        self._built = False

    def keep(self) -> str | None:
        """Watch the inbox folder that is there now: None while watched, or what is wrong
        ("missing", "not a folder", "unreachable: ..."), a state to wait out, logged once
        when it begins and when it ends. A new folder's files are offered at once."""
        problem, identity = _look(self.root)
        if problem != self.problem:
            self._log_change(problem)
            self.problem = problem
        if identity is None:
            self._stop_observer()
            return problem
        if identity == self._identity and self.observer and _alive(self.observer):
            return None
        again = self._built  # the first start's files come from the worker's first rescan
        self._rebuild(identity)
        if again:
            for path in candidates(self.root):  # what arrived while nobody was watching
                self.on_path(path)
            self.wake.set()
        return None

    def stop(self) -> None:
        """Stop the observer thread."""
        self._stop_observer()

    def _rebuild(self, identity: tuple[int, int]) -> None:
        if self.observer is not None:
            log.warning(
                "inbox watcher: %s stopped delivering events (folder replaced or "
                "observer stopped); restarting it",
                self.root,
            )
            self._stop_observer()
        if self._built:  # another folder than at start (a share mounted): decide again
            self.restarts += 1
            if self.decide is not None:
                self.polling = self.decide()
        self._built = True
        self._identity = identity
        self.observer = self._build()
        self.observer.start()

    def _stop_observer(self) -> None:
        if self.observer is not None:
            _stop(self.observer)
            self.observer = None
            self._identity = None

    def _log_change(self, problem: str | None) -> None:
        if problem is None:
            log.info("inbox %s is there again: taking its files", self.root)
        else:
            log.warning(
                "inbox %s is %s (a share not mounted yet?): waiting for it; files dropped "
                "there are taken once it is back",
                self.root,
                problem,
            )

    def _build(self) -> BaseObserver:
        observer: BaseObserver
        if self.polling:
            observer = PollingObserverVFS(
                os.lstat, _inbox_listdir(self.root), polling_interval=self.poll_seconds
            )
        else:
            observer = Observer()
        observer.daemon = True
        on_renamed = None if self.polling else self.on_renamed  # polled moves are guesses
        handler = _Handler(self.root, self.on_path, self.wake, on_renamed)
        observer.schedule(handler, str(self.root), recursive=True, event_filter=WATCHED_EVENTS)
        return observer


def _look(root: Path) -> tuple[str | None, tuple[int, int] | None]:
    """(what is wrong with the inbox folder or None, its identity when it is a folder)."""
    try:
        info = os.stat(root)
    except FileNotFoundError:
        return "missing", None
    except OSError as exc:
        return f"unreachable: {exc.strerror or exc}", None
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder", None
    return None, (info.st_dev, info.st_ino)


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
            kept = [
                e
                for e in entries
                if not NAMES.is_hidden(e.name)
                and (NAMES.is_client_folder(e.name) or not e.is_dir(follow_symlinks=False))
            ]
        return iter(kept)

    return listdir
