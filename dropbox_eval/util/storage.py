"""Whether the service's folders can take writes: a full, read-only or refused folder is a
named state (`/readyz`, `/metrics`, `status`, `check`), not a stream of tracebacks.

`probe` looks without writing (the file system's flags, its free blocks, the folder's
permission); `probe(..., write=True)` also writes and removes one small hidden file, which
catches what the flags do not show (a quota, a nearly full disk). Neither sees a disk with
a little room left that a larger write does not fit in: so the one writer (fileio.py) tells
`wrote` how each of its writes went, and a folder whose last write failed for want of space
or permission is reported as such until a later write into the same folder succeeds, or
REMEMBER_SECONDS pass without another failure there (a step refused by storage tries again
within a minute, so a lasting problem is remembered again before then). That memory is
this process's: the running service's `/readyz` and `/metrics` see it, other commands do
not. Nothing here repairs: once space returns, the next write succeeds and says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from ..errors import StorageFull, StorageUnavailable, storage_error

PROBE_BYTES = 4096  # one block: a folder that cannot take it cannot take a receipt either
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
REMEMBER_SECONDS = 600.0
_failed_lock = threading.Lock()
# the folder a write failed in -> (its error's class, errno, message, monotonic time)
_failed: dict[Path, tuple[type[StorageUnavailable], int, str, float]] = {}


class Folders(Protocol):
    """Where the service writes (the settings have them)."""

    @property
    def state_path(self) -> Path: ...

    @property
    def inbox_path(self) -> Path: ...

    @property
    def outbox_path(self) -> Path: ...


def folders(settings: Folders) -> list[tuple[str, Path]]:
    """The folders the service writes, with the name an operator knows them by."""
    return [
        ("state folder", settings.state_path),
        ("inbox", settings.inbox_path),
        ("outbox", settings.outbox_path),
    ]


def probe(label: str, folder: Path, *, write: bool = False) -> StorageUnavailable | None:
    """Why `folder` cannot take a write now (`label` names it in the message), or None;
    None too when it does not exist or is not a folder (another check's business), and
    after the last write into it (or a folder under it) failed, that failure."""
    try:
        if not stat.S_ISDIR(os.stat(folder).st_mode):
            return None
        info = os.statvfs(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return storage_error(exc, folder, what=label)
    if info.f_flag & os.ST_RDONLY:
        return StorageUnavailable(errno.EROFS, folder, what=label)
    if info.f_bavail == 0 or (info.f_files and info.f_favail == 0):  # no block or no inode
        return StorageFull(errno.ENOSPC, folder, what=label)
    if not os.access(folder, os.W_OK | os.X_OK):
        return StorageUnavailable(errno.EACCES, folder, what=label)
    return _last_failure(label, folder) or (_write_probe(label, folder) if write else None)


@contextlib.contextmanager
def wrote(folder: Path) -> Iterator[None]:
    """Around one write into `folder`: a StorageUnavailable raised in the block is
    remembered for `probe` (and raised on); a write that went through forgets it."""
    try:
        yield
    except StorageUnavailable as exc:
        with _failed_lock:
            _failed[folder.resolve()] = (type(exc), exc.errno or 0, str(exc), time.monotonic())
        raise
    if _failed:  # the usual case costs one look
        with _failed_lock:
            _failed.pop(folder.resolve(), None)


def _last_failure(label: str, folder: Path) -> StorageUnavailable | None:
    """The last remembered failure of a write into `folder` or a folder under it."""
    if not _failed:
        return None
    horizon, real = time.monotonic() - REMEMBER_SECONDS, folder.resolve()
    with _failed_lock:
        for place, (kind, code, message, at) in list(_failed.items()):
            if at < horizon:
                del _failed[place]
            elif place.is_relative_to(real):
                found = kind(code, place)
                found.message = f"{label} {folder}: {message}"
                return found
    return None


def _write_probe(label: str, folder: Path) -> StorageUnavailable | None:
    """Write and remove one block in `folder` (a hidden name: the inbox skips it)."""
    path = folder / f".storage-probe-{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        fd = os.open(path, _WRITE_FLAGS, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
    except OSError as exc:
        return storage_error(exc, folder, what=label)
    return None


def problems(settings: Folders, *, write: bool = False) -> list[StorageUnavailable]:
    """What stops each of the service's folders from taking writes (empty: nothing).
    `write` probes the state folder by writing too: it is the service's own, while
    clients list the inbox and the outbox."""
    found = (
        probe(label, folder, write=write and folder == settings.state_path)
        for label, folder in folders(settings)
    )
    return [problem for problem in found if problem is not None]


def require_writable(state_dir: Path) -> None:
    """Raise the StorageUnavailable of a full, read-only or refused state folder (for the
    commands that would otherwise say all is well); writes nothing."""
    problem = probe("state folder", state_dir)
    if problem is not None:
        raise problem
