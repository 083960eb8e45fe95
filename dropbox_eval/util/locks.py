"""SharedLock: an inter-process file lock that threads of one process hand over at once.

A `filelock.FileLock` waits by polling (every 50 ms): a thread that finds the lock held
sleeps a whole interval even when another thread of the same process releases it a
millisecond later. Two drops taken one after the other (the next batch recorded while the
previous one is being filed) then cost a client 50 ms for a 2 ms write. Here the threads
of a process queue on a thread lock first, which wakes the next one on release; only a
hold by another process (a CLI command, a second service) is polled.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

__all__ = ["SharedLock", "Timeout"]


class SharedLock:
    """Re-entrant within a thread; exclusive across threads and processes.

    `timeout` (seconds, -1 = wait for ever) bounds the whole wait, and a miss raises
    `filelock.Timeout` as a bare FileLock would.
    """

    def __init__(self, path: Path, timeout: float = -1.0) -> None:
        self.path = str(path)
        self.timeout = timeout
        self._threads = threading.RLock()
        self._file = FileLock(self.path, timeout=timeout, mode=0o600)

    def __enter__(self) -> SharedLock:
        start = time.monotonic()
        if not self._threads.acquire(timeout=self.timeout):
            raise Timeout(self.path)
        try:
            left = self.timeout
            if left >= 0:
                left = max(0.0, left - (time.monotonic() - start))
            self._file.acquire(timeout=left)
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._file.release()
        finally:
            self._threads.release()


def held_elsewhere(lock: FileLock) -> bool:
    """Whether another holder has `lock` now: how a command tells that a service or an
    endpoint runs on the state folder. Probed on a read-only descriptor (flock(2), which
    filelock uses on Linux, needs no write access) and let go at once, so it answers on a
    read-only or full folder too; a missing lock file is a lock nobody holds (nothing is
    created)."""
    try:
        descriptor = os.open(lock.lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return False
    finally:
        os.close(descriptor)
