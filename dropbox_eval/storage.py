"""Whether the service's folders can take writes: a full, read-only or refused folder is a
named state (`/readyz`, `/metrics`, `status`, `check`), not a stream of tracebacks.

`probe` looks without writing (the file system's flags, its free blocks, the folder's
permission); `probe(..., write=True)` also writes and removes one small hidden file, which
catches what the flags do not show (a quota, a nearly full disk). Nothing here repairs:
once space returns, the next write succeeds and the next probe says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import StorageFull, StorageUnavailable, storage_error

if TYPE_CHECKING:
    from .config import Settings

PROBE_BYTES = 4096  # one block: a folder that cannot take it cannot take a receipt either
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def folders(settings: Settings) -> list[tuple[str, Path]]:
    """The folders the service writes, with the name an operator knows them by."""
    return [
        ("state folder", settings.state_path),
        ("inbox", settings.inbox_path),
        ("outbox", settings.outbox_path),
    ]


def probe(label: str, folder: Path, *, write: bool = False) -> StorageUnavailable | None:
    """Why `folder` cannot take a write now (`label` names it in the message), or None;
    None too when it does not exist (a missing folder is another check's business)."""
    try:
        info = os.statvfs(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return storage_error(exc, folder, what=label)
    if info.f_flag & os.ST_RDONLY:
        return StorageUnavailable(errno.EROFS, folder, what=label)
    if info.f_bavail == 0:
        return StorageFull(errno.ENOSPC, folder, what=label)
    if not os.access(folder, os.W_OK | os.X_OK):
        return StorageUnavailable(errno.EACCES, folder, what=label)
    return _write_probe(label, folder) if write else None


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


def problems(settings: Settings, *, write: bool = False) -> list[StorageUnavailable]:
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
