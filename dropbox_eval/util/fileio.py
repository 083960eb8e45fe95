"""The one way a file is written: under a hidden name, then renamed into place (the
store, the inbox, the file emitter, `submit`'s hand-over and SFTP uploads).

A write that fails for want of space or permission raises errors.StorageUnavailable (or
StorageFull), still an OSError, naming the file and the cause (errors.storage_error); how
each write into a known folder went is told to storage.py (`/readyz`, `/metrics`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from ..errors import storage_errors
from . import crashpoints, storage

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE_MODE = 0o600  # the default: state files hold secrets (client webhook secrets, keys)
SHARED_MODE = 0o644  # what clients read: receipts, error files, filed drops, reports


def hidden_name(name: str, *, tag: str = "", unique: bool = False) -> str:
    """The hidden name a write of `name` goes through before it is renamed into place:
    `.{tag}{name}.tmp`. Deterministic by default (a write interrupted by a kill is replaced
    by the next write of the same name, so no hidden file is left behind for good);
    `unique` adds a random part for writers that may write one name at once (several
    processes, several SFTP sessions). `tag` marks whose it is (a leftover sweep)."""
    random = f"{secrets.token_hex(4)}." if unique else ""
    return f".{tag}{random}{name}.tmp"


def rename_into_place(folder_fd: int, hidden: str, name: str) -> None:
    """The last step of every write, once the hidden file's bytes are on disk (fsynced):
    rename it over `name` and fsync the folder, so readers see the old or the new file."""
    os.replace(hidden, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    os.fsync(folder_fd)


def write_at(
    folder_fd: int,
    name: str,
    data: bytes,
    *,
    tmp: str | None = None,
    mode: int = PRIVATE_MODE,
    where: Path | None = None,
) -> None:
    """Atomically write `data` as `name` in the folder open as `folder_fd`.

    Temp file in the same folder (never following a link), flush, fsync, rename over the
    target, fsync the folder: readers see the old or the new file, never a mix. The file
    gets `mode` whatever the umask: PRIVATE_MODE unless the caller writes for clients.
    `where` is the file's path for an error message and storage.py (a descriptor does not
    tell it).
    """
    tmp = tmp or hidden_name(name)
    watched = storage.wrote(where.parent) if where else contextlib.nullcontext()
    with watched, storage_errors(where or name):
        fd = os.open(tmp, _TMP_FLAGS, mode, dir_fd=folder_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            rename_into_place(folder_fd, tmp, name)
        except BaseException:
            with contextlib.suppress(OSError):  # gone, or the folder refuses even that
                os.unlink(tmp, dir_fd=folder_fd)
            raise
    crashpoints.wrote(name)


def write_atomically(path: Path, text: str | bytes, *, mode: int = PRIVATE_MODE) -> None:
    """Write `text` (UTF-8 when a str) to `path` atomically (see `write_at`, `mode` too),
    creating the folder if needed.

    The temp name is random here: several processes may write files in one state folder.
    """
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        folder_fd = os.open(path.parent, _DIR_FLAGS)
    try:
        write_at(
            folder_fd,
            path.name,
            text.encode("utf-8") if isinstance(text, str) else text,
            tmp=hidden_name(path.name, unique=True),
            mode=mode,
            where=path,
        )
    finally:
        os.close(folder_fd)


def json_bytes(data: Any) -> bytes:
    """Indented, key-sorted JSON (what people and programs read)."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json(path: Path, data: Any, *, mode: int = PRIVATE_MODE) -> None:
    """Atomically write `data` as indented JSON (`mode` as in `write_at`)."""
    write_atomically(path, json_bytes(data).decode("utf-8"), mode=mode)
