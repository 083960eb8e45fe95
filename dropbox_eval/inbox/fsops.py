"""File operations relative to folder descriptors: nothing follows a link out of the inbox."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
from typing import Any

from ..util import crashpoints
from ..util.fileio import SHARED_MODE, hidden_name, write_at

NAME_MAX = 255
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READ_CHUNK = 1 << 20


def claim(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # the filesystem has no locks (some shares): proceed unclaimed
    return True


def same_file(folder_fd: int, name: str, fd: int) -> bool:
    try:
        now = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def is_symlink_at(folder_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def exists_at(folder_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def outcome_name(name: str, suffix: str, counter: int = 0) -> str:
    """The name a drop is filed under: `name`, or `stem.N.ext` for the Nth clash.

    Shortened when the receipt or error file's temporary name would pass the 255-byte limit
    of file names: the stem is cut (at a character boundary) and `~` plus 8 hex digits of
    the original name's sha256 keep different long names apart. Every legal name fits.
    """
    stem, ext = os.path.splitext(name)
    tag = f".{counter}" if counter else ""
    candidate = f"{stem}{tag}{ext}"
    budget = NAME_MAX - len(hidden_name(suffix).encode()) - 1  # `.{target}{suffix}.tmp`
    if len(os.fsencode(candidate)) <= budget:  # the bytes the file system stores
        return candidate
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    keep = budget - len(os.fsencode(f"~{digest}{tag}{ext}"))
    short = os.fsencode(stem)[:keep].decode("utf-8", "ignore")
    return f"{short}~{digest}{tag}{ext}"


def choose_target(
    out_fd: int, name: str, suffix: str, document: dict[str, Any], fd: int | None = None
) -> str:
    """The first free outcome name; or the name an interrupted filing of this very drop
    already used (its receipt/error file for the same bytes and batch, or the drop itself
    linked in: `fd` is the drop), so that after a crash the file and its receipt end up
    side by side, once."""
    counter = 0
    while True:
        target = outcome_name(name, suffix, counter)
        earlier = _read_small_json(out_fd, f"{target}{suffix}")
        ours = earlier is _ABSENT or _same_filing(earlier, document)
        if ours and (not exists_at(out_fd, target) or _is_opened(out_fd, target, fd)):
            return target
        counter += 1


def _is_opened(folder_fd: int, name: str, fd: int | None) -> bool:
    return fd is not None and same_file(folder_fd, name, fd)


def _same_filing(earlier: Any, document: dict[str, Any]) -> bool:
    return (
        isinstance(earlier, dict)
        and earlier.get("sha256") == document.get("sha256")
        and earlier.get("batch_id") == document.get("batch_id")
    )


_ABSENT = object()


def _read_small_json(folder_fd: int, name: str) -> Any:
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=folder_fd)
    except FileNotFoundError:
        return _ABSENT
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            return json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None


def move_opened(fd: int | None, folder_fd: int, name: str, out_fd: int, target: str) -> bool:
    """Move the drop into the outcome folder; False only when a file that was never opened
    (a symlink) vanished meanwhile.

    With the file open (`fd`), the very inode that was read is linked into place through
    /proc, and the inbox name is removed only while it still names that inode; a new upload
    that took the name stays for the next look. A drop that was replaced or deleted while
    it was being taken in is filed from the open descriptor, so its bytes are kept all the
    same. Without /proc or hard links (some shares), a rename after the same check.
    """
    if fd is None:
        try:
            os.rename(name, target, src_dir_fd=folder_fd, dst_dir_fd=out_fd)
        except FileNotFoundError:
            return False
        crashpoints.wrote(f"moved {name}")
        return True
    if os.fstat(fd).st_nlink == 0:
        write_at(out_fd, target, _read_all(fd), mode=SHARED_MODE)
        return True
    try:
        if not same_file(out_fd, target, fd):  # else linked in before a kill
            os.link(f"/proc/self/fd/{fd}", target, dst_dir_fd=out_fd, follow_symlinks=True)
    except OSError:  # no /proc, no hard links, protected_hardlinks
        if not same_file(folder_fd, name, fd):
            write_at(out_fd, target, _read_all(fd), mode=SHARED_MODE)
            return True
        os.rename(name, target, src_dir_fd=folder_fd, dst_dir_fd=out_fd)
        crashpoints.wrote(f"moved {name}")
        return True
    crashpoints.wrote(f"linked {name}")
    if same_file(folder_fd, name, fd):
        os.unlink(name, dir_fd=folder_fd)
        crashpoints.wrote(f"unlinked {name}")
    return True


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, READ_CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def kind(mode: int) -> str:
    kinds = {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFCHR: "a device",
        stat.S_IFBLK: "a device",
        stat.S_IFDIR: "a directory",
        stat.S_IFLNK: "a link",
    }
    return kinds.get(stat.S_IFMT(mode), "not a regular file")
