"""One upload through the SFTP endpoint: written under a hidden name, renamed into place
when the client closes it, removed when it cannot complete (size limit, storage quota,
resume, a session that ended first)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass

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

from ..util.fileio import hidden_name, rename_into_place
from .bounds import SessionBounds
from .paths import UPLOAD_PREFIX, Target, stat_at, writable_name


@dataclass
class Upload:
    """An open upload: the hidden file `temp`, renamed to `name` on close."""

    fd: int
    name: str
    temp: str
    bounds: SessionBounds
    size: int = 0
    error: str | None = None


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
        upload.bounds.grow(upload.temp, max(upload.size, offset + len(data)))
    except SFTPQuotaExceeded as exc:
        upload.error = exc.reason
        discard(root, upload)
        raise
    written = os.pwrite(upload.fd, data, offset)
    upload.size = max(upload.size, offset + written)
    return written


def complete(root: int, upload: Upload) -> str:
    """fsync, then rename the hidden file into place; the sha256 of what was written."""
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(upload.fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    os.fsync(upload.fd)
    os.close(upload.fd)
    upload.fd = -1
    rename_into_place(root, upload.temp, upload.name)
    upload.bounds.end_upload(upload.temp, kept=True)
    return digest.hexdigest()


def discard(root: int, upload: Upload) -> None:
    """Close and remove the hidden file (nothing of the upload stays)."""
    upload.bounds.end_upload(upload.temp, kept=False)
    if upload.fd >= 0:
        os.close(upload.fd)
        upload.fd = -1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(upload.temp, dir_fd=root)
