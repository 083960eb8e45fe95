"""Per-client bounds of the SFTP endpoint: open files and the storage quota.

One process serves every client, so one client's use must not become everyone's limit:

- open files (uploads and downloads, one descriptor each) are capped per session
  (`SAAS_EVAL_SFTP_MAX_OPEN_FILES`) and per client over all its sessions
  (`SAAS_EVAL_SFTP_MAX_CLIENT_OPEN_FILES`); at start the process raises its own descriptor
  limit (RLIMIT_NOFILE) to the hard limit, so the caps, not the kernel, are what a client
  meets;
- the bytes a client keeps in its folder (pending drops, temporary names, uploads being
  written, and rejected drops with their error files in `rejected/` until the retention
  prune removes them) are capped by `SAAS_EVAL_CLIENT_QUOTA_BYTES`. Each file counts at
  least one 4 KiB block, so empty files cannot exhaust the folder either. Accepted drops
  (`accepted/`) do not count: the client paid for them in credits.

The folder (and its `rejected/`) is listed when an upload starts, unless it was listed
less than LISTING_SECONDS ago; between listings the uploads are counted in memory (their
growth as they are written, and each one renamed into place), so neither a write nor a
stream of small uploads pays for a listing each. The count in memory only grows between
listings (files the service takes away are subtracted at the next one), so an upload it
admits, a fresh listing would admit too, but for files put in the folder beside the
endpoint (a shared volume, the service's error files) within the last LISTING_SECONDS. No
upload is refused on that count alone: the folder is listed again first.
"""

from __future__ import annotations

import logging
import os
import resource
import stat
import time
from dataclasses import dataclass, field

from asyncssh import SFTPFailure, SFTPNoSuchFile, SFTPQuotaExceeded

log = logging.getLogger("dropbox_eval")

BLOCK = 4096
LISTING_SECONDS = 1.0
REJECTED = "rejected"


class OpenFilesLimit(SFTPFailure):
    """A session or its client holds as many open files as it may."""


def blocks(size: int) -> int:
    """The bytes a file of `size` counts against the quota: whole blocks, at least one."""
    return max(BLOCK, -(-size // BLOCK) * BLOCK)


@dataclass
class _ClientUse:
    open_files: int = 0
    listed: int = 0  # pending bytes at the last listing, uploads being written left out
    listed_at: float = float("-inf")  # time.monotonic() of that listing
    writing: dict[str, int] = field(default_factory=dict)  # hidden name -> bytes written


class Bounds:
    """The limits every session of the endpoint shares, per client."""

    def __init__(self, session_files: int, client_files: int, quota_bytes: int) -> None:
        """Caps of open files per session and per client; the per-client quota in bytes."""
        self.session_files = session_files
        self.client_files = client_files
        self.quota_bytes = quota_bytes
        self._clients: dict[str, _ClientUse] = {}

    def session(self, client_id: str) -> SessionBounds:
        """The bounds of one new session of `client_id`."""
        return SessionBounds(self, self._clients.setdefault(client_id, _ClientUse()))


class SessionBounds:
    """One session's open files, and its client's shared use."""

    def __init__(self, bounds: Bounds, use: _ClientUse) -> None:
        self._bounds = bounds
        self._use = use
        self.open_files = 0

    def open_file(self) -> None:
        """Take a slot for a new open file, or raise the SFTP error the client is shown."""
        limits = self._bounds
        if self.open_files >= limits.session_files:
            raise OpenFilesLimit(
                f"too many open files: {self.open_files} in this session (limit "
                f"{limits.session_files}, SAAS_EVAL_SFTP_MAX_OPEN_FILES); close one first"
            )
        if self._use.open_files >= limits.client_files:
            raise OpenFilesLimit(
                f"too many open files: {self._use.open_files} in your sessions (limit "
                f"{limits.client_files}, SAAS_EVAL_SFTP_MAX_CLIENT_OPEN_FILES); close one first"
            )
        self.open_files += 1
        self._use.open_files += 1

    def close_file(self) -> None:
        """Give back a slot taken by `open_file`."""
        self.open_files -= 1
        self._use.open_files -= 1

    def start_upload(self, root: int, temp: str) -> None:
        """Count a new upload (hidden name `temp`) once the folder `root` has room for it."""
        if time.monotonic() - self._use.listed_at >= LISTING_SECONDS:
            self._list(root)
        self._use.writing[temp] = 0
        try:
            self.grow(temp, 0, root)
        except SFTPQuotaExceeded:
            del self._use.writing[temp]  # never started: it holds no room
            raise

    def grow(self, temp: str, size: int, root: int | None = None) -> None:
        """The upload `temp` now holds `size` bytes; SFTPQuotaExceeded if that passes the
        quota (the caller discards the upload), on a fresh listing of its folder `root`."""
        others = sum(blocks(n) for name, n in self._use.writing.items() if name != temp)
        quota = self._bounds.quota_bytes
        if root is not None and self._use.listed + others + blocks(size) > quota:
            self._list(root)  # the count may be stale, and only ever too high
        pending = self._use.listed + others
        if pending + blocks(size) > quota:
            raise SFTPQuotaExceeded(
                f"over your storage quota: {pending} bytes are waiting in your folder and "
                f"this upload would add {blocks(size)}; the limit is {quota} "
                "(SAAS_EVAL_CLIENT_QUOTA_BYTES). Upload discarded: wait until your pending "
                "files are read, or remove temporary files and rejected/ files you no longer "
                "need"
            )
        self._use.writing[temp] = size

    def _list(self, root: int) -> None:
        self._use.listed = _pending_bytes(root, set(self._use.writing))
        self._use.listed_at = time.monotonic()

    def end_upload(self, temp: str, *, kept: bool) -> None:
        """The upload `temp` ended: `kept` when it was renamed into place (it is pending)."""
        size = self._use.writing.pop(temp, None)
        if kept and size is not None:
            self._use.listed += blocks(size)


def _pending_bytes(root: int, writing: set[str]) -> int:
    """What the regular files at the top of a client folder and in its `rejected/` count,
    uploads being written (`writing`) left out: they are counted as they grow."""
    return _files_bytes(root, writing) + _rejected_bytes(root)


def _rejected_bytes(root: int) -> int:
    """Rejected drops and their error files: a drop the service refused still takes the
    client's room until it is pruned (a free way to store files otherwise)."""
    try:
        folder = os.open(REJECTED, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
    except OSError:
        return 0  # none yet (or not a folder: the inbox refuses to file there)
    try:
        return _files_bytes(folder, set())
    finally:
        os.close(folder)


def remove_rejected(root: int, name: str) -> None:
    """Remove a rejected drop or error file of the client folder `root` (a regular file:
    never a link's target, never a folder)."""
    try:
        folder = os.open(REJECTED, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
    except OSError:
        raise SFTPNoSuchFile("no such file") from None
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise SFTPNoSuchFile("no such file")
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        raise SFTPNoSuchFile("no such file") from None
    finally:
        os.close(folder)


def _files_bytes(root: int, writing: set[str]) -> int:
    total = 0
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name in writing:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += blocks(info.st_size)
    return total


def raise_descriptor_limit() -> int:
    """Raise this process's open-file limit (RLIMIT_NOFILE) to its hard limit; returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("sftp: open-file limit (RLIMIT_NOFILE) raised from %d to %d", soft, hard)
        return hard
    return soft
