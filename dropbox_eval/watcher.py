"""Watchdog observer on the inbox; events are wake-ups that hand paths to the tracker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver


class _Handler(FileSystemEventHandler):
    def __init__(self, on_path: Callable[[Path], None], wake: threading.Event) -> None:
        self.on_path = on_path
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        for raw in (getattr(event, "dest_path", ""), event.src_path):
            if raw:
                self.on_path(Path(str(raw)))
        self.wake.set()


class InboxWatcher:
    """Runs a (polling, for network shares) observer over the inbox, recursively."""

    def __init__(self, root: Path, on_path: Callable[[Path], None], wake: threading.Event,
                 *, polling: bool = False, poll_seconds: float = 1.0) -> None:
        self.root = root
        self.observer = PollingObserver(timeout=poll_seconds) if polling else Observer()
        self.observer.schedule(_Handler(on_path, wake), str(root), recursive=True)

    def start(self) -> None:
        """Start the observer thread."""
        self.observer.daemon = True
        self.observer.start()

    def stop(self) -> None:
        """Stop and join the observer thread."""
        self.observer.stop()
        self.observer.join(timeout=5)
