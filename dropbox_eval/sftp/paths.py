"""The jail's path policy: the fixed shape of a client's SFTP view and its folder descriptor.

A client sees its own folder as `/`, with `accepted/` and `rejected/` below it, and the
read-only view of its reports, `reports/` and `reports/undelivered/` (reports.py), and
nothing else. Paths are never joined onto the disk: they are checked against that shape,
and the file-system calls are made relative to directory descriptors opened with
O_NOFOLLOW. A name with a control character (a newline, an escape) is refused outright.
Which file names a client may write is the inbox's own rule (namefilter.NAMES): drops,
temporary names and hidden names (an upload tool's file in progress), so every upload
recipe that works on the inbox works here.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from asyncssh import SFTPInvalidFilename, SFTPNoSuchFile, SFTPPermissionDenied

from ..protocol.namefilter import NAMES
from ..util.names import OUTCOME_DIRS, REPORTS_DIR, UNDELIVERED_DIR
from ..util.printable import unprintable_reason

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_NAME_BYTES = 200  # leaves room for the hidden upload name within NAME_MAX (255)
UPLOAD_PREFIX = ".sftp-"


@dataclass(frozen=True)
class Target:
    """A checked client path: `folder` None is the client folder, else `accepted`,
    `rejected`, `reports` or `reports/undelivered`; `name` None is the folder itself."""

    folder: str | None
    name: str | None

    def __str__(self) -> str:
        """The path in the client's view, without the leading `/` (`accepted/x.json`)."""
        return "/".join(part for part in (self.folder, self.name) if part is not None)


def parse_path(raw: bytes) -> Target:
    """Map a client path onto the jail's fixed shape, or raise the SFTP error to send."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SFTPNoSuchFile("file names must be UTF-8") from None
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise SFTPPermissionDenied("'..' is not allowed: your folder is the root")
    if any("\0" in part for part in parts):
        raise SFTPNoSuchFile("file names cannot hold NUL")
    for part in parts:
        bad = unprintable_reason(part)
        if bad is not None:
            raise SFTPInvalidFilename(bad)
    if parts[:2] == [REPORTS_DIR, UNDELIVERED_DIR]:
        parts = [f"{REPORTS_DIR}/{UNDELIVERED_DIR}", *parts[2:]]
    if not parts:
        return Target(None, None)
    folders = (*OUTCOME_DIRS, REPORTS_DIR, f"{REPORTS_DIR}/{UNDELIVERED_DIR}")
    if len(parts) == 1:
        if parts[0] in folders:
            return Target(parts[0], None)
        _refuse_our_own(parts[0])
        return Target(None, parts[0])
    if len(parts) == 2 and parts[0] in folders:
        if NAMES.is_hidden(parts[1]):  # receipts being written: never a client's file
            raise SFTPPermissionDenied(
                "hidden names in accepted/, rejected/ and reports/ are not available"
            )
        return Target(parts[0], parts[1])
    raise SFTPNoSuchFile(
        "no such file: only your folder, accepted/, rejected/, reports/ and "
        "reports/undelivered/ exist"
    )


class FixedShape:
    """The SFTP operations the jail's fixed shape refuses outright: links and folders."""

    def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        """Refused."""
        raise SFTPPermissionDenied("links are not allowed")

    def link(self, oldpath: bytes, newpath: bytes) -> None:
        """Refused."""
        raise SFTPPermissionDenied("links are not allowed")

    def readlink(self, path: bytes) -> bytes:
        """Refused."""
        raise SFTPPermissionDenied("links are not allowed")

    def mkdir(self, path: bytes, attrs: object) -> None:
        """Refused."""
        raise SFTPPermissionDenied("folders cannot be created")

    def rmdir(self, path: bytes) -> None:
        """Refused."""
        raise SFTPPermissionDenied("folders cannot be removed")


def _refuse_our_own(name: str) -> None:
    """The endpoint's own upload files (`.sftp-...`) are not the client's to touch."""
    if name.startswith(UPLOAD_PREFIX):
        raise SFTPPermissionDenied(f"names starting with {UPLOAD_PREFIX!r} are the endpoint's own")


def listed(folder: str | None, name: str) -> bool:
    """Whether a folder listing shows `name`: the client's own names (hidden ones too, as
    OpenSSH's server does), never the endpoint's uploads in progress or a hidden file in
    an outcome folder."""
    if folder is not None:
        return not NAMES.is_hidden(name)
    return not name.startswith(UPLOAD_PREFIX)


def writable_name(target: Target) -> str:
    """The file name a client may create, rename or remove, or raise PermissionDenied."""
    if target.folder is not None or target.name is None:
        where = f"{target.folder}/" if target.folder else "your folder itself"
        raise SFTPPermissionDenied(f"{where} is read-only")
    name = target.name
    if not NAMES.is_upload(name):
        raise SFTPPermissionDenied(f"only {NAMES.candidate_names()} can be written")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise SFTPPermissionDenied(f"file name longer than {MAX_NAME_BYTES} bytes")
    return name


def open_client_folder(folder: Path) -> int:
    """A descriptor of `inbox/<client>`, created if missing; a symlinked folder is refused."""
    inbox = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder.name, 0o755, dir_fd=inbox)
        return os.open(folder.name, DIR_FLAGS, dir_fd=inbox)
    finally:
        os.close(inbox)


def stat_at(folder_fd: int, name: str) -> os.stat_result | None:
    """lstat of `name` in a folder descriptor, or None if it does not exist."""
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def visible(info: os.stat_result, target: Target) -> bool:
    """Regular files, plus the two outcome folders at the top; never links or devices (the
    reports view is not on disk here: reports.py shows it)."""
    if stat.S_ISREG(info.st_mode):
        return True
    return target.folder is None and target.name in OUTCOME_DIRS and stat.S_ISDIR(info.st_mode)


def sweep_uploads(inbox: Path) -> int:
    """Remove hidden uploads left by an endpoint that was killed; returns how many.

    Run at start only: the endpoint lock guarantees no other endpoint writes them.
    """
    removed = 0
    for folder in inbox.iterdir() if inbox.is_dir() else ():
        if folder.is_symlink() or not folder.is_dir():
            continue
        for leftover in folder.glob(f"{UPLOAD_PREFIX}*.tmp"):
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink(missing_ok=True)
                removed += 1
    return removed
