"""SharedLock: an inter-process file lock that threads of one process hand over at once.

A `filelock.FileLock` waits by polling (every 50 ms): a thread that finds the lock held
sleeps a whole interval even when another thread of the same process releases it a
millisecond later. Two drops taken one after the other (the next batch recorded while the
previous one is being filed) then cost a client 50 ms for a 2 ms write. Here the threads
of a process queue on a thread lock first, which wakes the next one on release; only a
hold by another process (a CLI command, a second service) is waited for on the file.

The file part is a bare `flock(2)` on a descriptor kept open, the very lock `filelock`
takes on Linux, so the two exclude each other. A FileLock acquire and release costs about
100 us of CPU (it opens, probes and closes the file each time, and tracks forks); the store
takes its locks several times a drop, so that was 5 % of a drop's CPU. A lock file that
was removed or replaced while we waited is opened again, as filelock would. The cost:
a descriptor per lock used, for the lock's life (a TinyDB store has at most 66: its
lock, 64 record stripes and the history's).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

__all__ = ["FileClaim", "SharedLock", "Timeout"]

POLL_SECONDS = 0.01  # a bounded wait on another process's hold looks this often
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_live: weakref.WeakSet[SharedLock] = weakref.WeakSet()


class SharedLock:
    """Re-entrant within a thread; exclusive across threads and processes.

    `timeout` (seconds, -1 = wait for ever) bounds the whole wait, and a miss raises
    `filelock.Timeout` as a bare FileLock would.
    """

    def __init__(self, path: Path, timeout: float = -1.0) -> None:
        self.path = str(path)
        self.timeout = timeout
        self._threads = threading.RLock()
        self._depth = 0  # holds by the owning thread
        self._fd: int | None = None
        _live.add(self)

    def __enter__(self) -> SharedLock:
        deadline = None if self.timeout < 0 else time.monotonic() + self.timeout
        if not self._threads.acquire(timeout=self.timeout):
            raise Timeout(self.path)
        try:
            if self._depth == 0:
                self._lock_file(deadline)
            self._depth += 1
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
            self._depth -= 1
            if self._depth == 0 and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def __del__(self) -> None:
        self._forget()

    def _lock_file(self, deadline: float | None) -> None:
        """flock the lock file, waiting until `deadline` (None: for ever); the caller holds
        the thread lock."""
        while True:
            fd = self._descriptor()
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # the GIL is let go while it waits
            elif not _lock_by(fd, deadline):
                raise Timeout(self.path)
            if self._still_named(fd):
                return
            fcntl.flock(fd, fcntl.LOCK_UN)  # an orphan: removed or replaced meanwhile
            self._forget()

    def _descriptor(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, _OPEN_FLAGS, 0o600)
            except OSError as exc:  # a read-only folder: an existing lock file still locks
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return self._fd

    def _still_named(self, fd: int) -> bool:
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def _forget(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _after_fork(self) -> None:
        """In a forked child: nothing is held there, and the descriptor's lock is the
        parent's (flock locks belong to the open file, which the child shares)."""
        self._threads = threading.RLock()
        self._depth = 0
        self._fd = None  # left open: closing or unlocking it here would touch the parent's


class FileClaim:
    """One process-wide claim on a lock file (`flock(2)`, as filelock takes it), not
    re-entrant: each `take` opens the file, and `release` closes it, which lets go."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._fd: int | None = None

    def take(self, wait: float = 0.0) -> bool:
        """Claim the file, waiting up to `wait` seconds; False when another holder kept it
        that long (nothing is then held)."""
        fd = os.open(self.path, _OPEN_FLAGS, 0o600)
        if not _lock_by(fd, time.monotonic() + wait):
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Let go of a claim `take` got."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _lock_by(fd: int, deadline: float) -> bool:
    """flock `fd`, trying every POLL_SECONDS until `deadline` (a monotonic time) passes;
    False when another holder kept it that long."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        else:
            return True


def _reset_in_child() -> None:
    for lock in list(_live):
        lock._after_fork()


os.register_at_fork(after_in_child=_reset_in_child)


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
