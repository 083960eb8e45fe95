"""One upload through the SFTP endpoint: written under a hidden name and hashed as it is
written, made durable and renamed into place when the client closes it (durable.py says in
which order, and what a crash leaves), removed when it cannot complete (size limit, storage
quota, resume, a session that ended first).

A small upload is usually whole after its first write, so that write starts the file's
fdatasync at once, in a worker thread (`sync_early`): it runs while the write's answer and
the client's close cross the connection, instead of after the close. The close waits for it
and syncs again only if anything was written after it began; a failed one fails the upload.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncssh import (
    FXF_APPEND,
    FXF_CREAT,
    FXF_EXCL,
    FXF_READ,
    SFTPFailure,
    SFTPFileAlreadyExists,
    SFTPNoSuchFile,
    SFTPOpUnsupported,
    SFTPQuotaExceeded,
)

from ..util import crashpoints
from ..util.fileio import hidden_name
from .bounds import SessionBounds
from .durable import FolderSync
from .paths import UPLOAD_PREFIX, Target, stat_at, writable_name

EARLY_SYNC_BYTES = 64 * 1024
"""An upload no larger than this after its first write has its fdatasync begun at once."""

FileReport = Callable[[str, int, str, str | None], None]
"""Called once per upload: (name, bytes, outcome, sha256 of a completed file)."""


@dataclass
class Upload:
    """An open upload: the hidden file `temp`, renamed to `name` on close."""

    fd: int
    name: str
    temp: str
    bounds: SessionBounds
    size: int = 0
    error: str | None = None
    sha256: Any = field(default_factory=hashlib.sha256)
    """Of the bytes written so far, while they come in order; None once a write went back."""
    writes: int = 0
    synced: int = -1
    """`writes` as of the last fdatasync that has ended (the client's fsync request)."""
    early: asyncio.Future[int] | None = None
    """The early fdatasync (`sync_early`); its result is the `writes` it covers."""


def start(root: int, target: Target, pflags: int, bounds: SessionBounds) -> Upload:
    """Open a new hidden file for an upload to `target` in the folder `root`, if the
    client's quota has room for it (SFTPQuotaExceeded otherwise)."""
    name = writable_name(target)
    if pflags & (FXF_READ | FXF_APPEND):
        raise SFTPOpUnsupported("uploads are write-only and cannot append")
    existing = stat_at(root, name)
    if existing is None and not pflags & FXF_CREAT:
        raise SFTPNoSuchFile(f"no such file: {name}")
    if existing is not None and pflags & FXF_EXCL:
        raise SFTPFileAlreadyExists(f"{name} already exists")
    # Every upload starts as a new file, with or without FXF_TRUNC (scp opens without it
    # and sets the size at the end); a resume is refused by `write` (no holes).
    temp = hidden_name(name, tag=UPLOAD_PREFIX.lstrip("."), unique=True)
    bounds.start_upload(root, temp)
    try:
        fd = os.open(
            temp,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=root,
        )
    except BaseException:
        bounds.end_upload(temp, kept=False)
        raise
    return Upload(fd, name, temp, bounds)


def write(root: int, upload: Upload, offset: int, data: bytes, max_bytes: int) -> int:
    """Write a chunk; a hole (a resume), passing `max_bytes` or the client's storage quota
    discards the upload."""
    if upload.error:
        raise SFTPFailure(upload.error)
    if offset > upload.size:
        upload.error = "resuming an upload is not supported: upload the whole file again"
        discard(root, upload)
        raise SFTPOpUnsupported(upload.error)
    if offset + len(data) > max_bytes:
        upload.error = (
            f"file too large: over the {max_bytes}-byte limit "
            "(SAAS_EVAL_MAX_FILE_BYTES); upload discarded"
        )
        discard(root, upload)
        raise SFTPFailure(upload.error)
    try:
        upload.bounds.grow(upload.temp, max(upload.size, offset + len(data)), root)
    except SFTPQuotaExceeded as exc:
        upload.error = exc.reason
        discard(root, upload)
        raise
    written = os.pwrite(upload.fd, data, offset)
    if upload.sha256 is not None and offset == upload.size:
        upload.sha256.update(data[:written])
    elif offset < upload.size:
        upload.sha256 = None  # a write over earlier bytes: hashed again at the close
    upload.size = max(upload.size, offset + written)
    upload.writes += 1
    return written


def sync_early(upload: Upload) -> None:
    """Begin the fdatasync of a small upload after its first write (module docstring), on
    a descriptor of its own, so that a discard may close the upload's meanwhile."""
    if upload.early is not None or upload.fd < 0 or upload.size > EARLY_SYNC_BYTES:
        return
    loop = asyncio.get_running_loop()
    upload.early = loop.run_in_executor(None, _sync_copy, os.dup(upload.fd), upload.writes)
    upload.early.add_done_callback(_retrieved)  # a discarded upload's error is not news


def _sync_copy(fd: int, covers: int) -> int:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return covers


def _retrieved(done: asyncio.Future[int]) -> None:
    if not done.cancelled():
        done.exception()


async def flush(upload: Upload) -> None:
    """The client's fsync request: every write so far durable, off the event loop."""
    if upload.fd >= 0:
        covers = upload.writes
        await asyncio.to_thread(os.fsync, upload.fd)
        upload.synced = max(upload.synced, covers)


async def close(
    root: int, upload: Upload, folder: FolderSync, report: FileReport, *, by_client: bool
) -> None:
    """The upload's handle was closed, `by_client` or by the end of its session: complete
    it, or remove it; either way `report` it once. Raises the SFTP error the client sees."""
    if upload.error:
        report(upload.name, upload.size, f"refused ({upload.error})", None)
        if by_client:
            raise SFTPFailure(upload.error)
        return
    if not by_client:
        discard(root, upload)
        report(upload.name, upload.size, "dropped", None)
        return
    try:
        digest = await complete(root, upload, folder)
    except Exception as exc:  # noqa: BLE001 - whatever failed, no partial file stays
        discard(root, upload)
        report(upload.name, upload.size, f"failed ({exc})", None)
        raise SFTPFailure("could not complete the upload; upload it again") from None
    report(upload.name, upload.size, "completed", digest)


async def complete(root: int, upload: Upload, folder: FolderSync) -> str:
    """Make the upload durable in place (durable.py: fdatasync, rename, the folder's shared
    fsync); the sha256 of what was written. The disk waits run off the event loop."""
    if upload.sha256 is not None:
        digest: str = upload.sha256.hexdigest()
    else:
        digest = await asyncio.to_thread(_hash_file, upload.fd)
    with crashpoints.operation("sftp-upload"):
        covered = upload.synced
        if upload.early is not None:
            covered = max(covered, await upload.early)  # its failure fails the upload
        if covered != upload.writes:  # not begun early, or written since
            await asyncio.to_thread(os.fdatasync, upload.fd)
        crashpoints.wrote(f"fsync {upload.temp}")
        os.close(upload.fd)
        upload.fd = -1
        os.replace(upload.temp, upload.name, src_dir_fd=root, dst_dir_fd=root)
        crashpoints.wrote(f"rename {upload.name}")
        upload.bounds.end_upload(upload.temp, kept=True)
        await folder.synced(root)
        crashpoints.wrote("fsync the client folder")
    return digest


def _hash_file(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def discard(root: int, upload: Upload) -> None:
    """Close and remove the hidden file (nothing of the upload stays)."""
    upload.bounds.end_upload(upload.temp, kept=False)
    if upload.fd >= 0:
        os.close(upload.fd)
        upload.fd = -1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(upload.temp, dir_fd=root)
