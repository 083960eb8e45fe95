"""Opening and reading a drop relative to descriptors, never following a link out of the
inbox, and only the very file that was looked at."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import BatchRejected
from ..protocol.batchfile import check_size
from . import fsops
from .filing import Skip
from .readiness import signature


def open_folder(root: Path, folder: Path) -> int:
    """A descriptor of `folder` (the inbox `root` or one client folder below it), never
    through a link: a symlinked client folder is a Skip."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if folder == root:
        return root_fd
    try:
        return os.open(folder.name, fsops.DIR_FLAGS, dir_fd=root_fd)
    except OSError as exc:
        if fsops.is_symlink_at(root_fd, folder.name):
            raise Skip(
                "symlinked_folder",
                f"client folder {folder.name!r} is a symbolic link; files in it are ignored",
            ) from exc
        raise
    finally:
        os.close(root_fd)


def open_file(folder_fd: int, name: str) -> int:
    """A descriptor of the regular file `name`: a link is refused (BatchRejected), anything
    else that is not a plain file, or a file replaced meanwhile, is a Skip."""
    info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        raise BatchRejected("symlink", "symbolic links are refused; upload the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise Skip("not_a_file", f"not a regular file ({fsops.kind(info.st_mode)})")
    try:
        fd = os.open(name, fsops.FILE_FLAGS, dir_fd=folder_fd)
    except OSError as exc:
        if fsops.is_symlink_at(folder_fd, name):
            raise BatchRejected(
                "symlink", "symbolic links are refused; upload the file itself"
            ) from exc
        raise
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or opened.st_ino != info.st_ino:
        os.close(fd)
        raise Skip("changed", "the file was replaced while being opened")
    return fd


def read_whole(fd: int, max_bytes: int) -> bytes:
    """The file's bytes, at most `max_bytes` (BatchRejected past it); a Skip when it
    changed while being read."""
    before = os.fstat(fd)
    check_size(before.st_size, max_bytes)
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        chunk = os.read(fd, min(fsops.READ_CHUNK, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    check_size(total, max_bytes)
    after = os.fstat(fd)
    if signature(after) != signature(before) or total != after.st_size:
        raise Skip(
            "changed",
            "the file changed while being read; it will be read again once it stays unchanged",
        )
    return b"".join(chunks)
