"""The one way a file is written: under a hidden name, then renamed into place (the
store, the inbox, the file emitter, `submit`'s hand-over and SFTP uploads).

A write that fails for want of space or permission raises errors.StorageUnavailable (or
StorageFull), still an OSError, naming the file and the cause (errors.storage_error); how
each write into a known folder went is told to storage.py (`/readyz`, `/metrics`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import storage_errors
from . import crashpoints, storage
from .canonicaljson import canonical

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE_MODE = 0o600  # the default: state files hold secrets (client webhook secrets, keys)
PRIVATE_FOLDER_MODE = 0o700  # the folders of private files (the state folder's)
SHARED_MODE = 0o644  # what clients read: receipts, error files, filed drops, reports


def hidden_name(name: str, *, tag: str = "", unique: bool = False) -> str:
    """The hidden name a write of `name` goes through before it is renamed into place:
    `.{tag}{name}.tmp`. Deterministic by default (a write interrupted by a kill is replaced
    by the next write of the same name, so no hidden file is left behind for good);
    `unique` adds a random part for writers that may write one name at once (several
    processes, several SFTP sessions). `tag` marks whose it is (a leftover sweep)."""
    random = f"{secrets.token_hex(4)}." if unique else ""
    return f".{tag}{random}{name}.tmp"


def rename_into_place(folder_fd: int, hidden: str, name: str, *, durable: bool = True) -> None:
    """The last step of every write, once the hidden file's bytes are on disk (fsynced):
    rename it over `name` and fsync the folder, so readers see the old or the new file."""
    os.replace(hidden, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    if durable:
        os.fsync(folder_fd)


def write_at(
    folder_fd: int,
    name: str,
    data: bytes | Iterable[bytes],
    *,
    tmp: str | None = None,
    mode: int = PRIVATE_MODE,
    where: Path | None = None,
    durable: bool = True,
    sync_folder: bool = True,
) -> None:
    """Atomically write `data` as `name` in the folder open as `folder_fd`.

    Temp file in the same folder (never following a link), flush, fsync, rename over the
    target, fsync the folder: readers see the old or the new file, never a mix. The file
    gets `mode` whatever the umask: PRIVATE_MODE unless the caller writes for clients.
    `where` is the file's path for an error message and storage.py (a descriptor does not
    tell it). Not `durable`: renamed into place without either fsync, for a file whose
    content is durable elsewhere until it is synced (`fsync_file`): a kill keeps it, a power
    loss may not. Without `sync_folder`, the caller syncs the folder after a later change
    in it, one sync for both.
    """
    tmp = tmp or hidden_name(name)
    watched = storage.wrote(where.parent) if where else contextlib.nullcontext()
    with watched, storage_errors(where or name):
        fd = os.open(tmp, _TMP_FLAGS, mode, dir_fd=folder_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)
                if isinstance(data, bytes):
                    handle.write(data)
                else:  # written piece by piece: a big file is never whole in memory
                    handle.writelines(data)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            rename_into_place(folder_fd, tmp, name, durable=durable and sync_folder)
        except BaseException:
            with contextlib.suppress(OSError):  # gone, or the folder refuses even that
                os.unlink(tmp, dir_fd=folder_fd)
            raise
    crashpoints.wrote(name)


def make_folders(path: Path, *, private: bool = True) -> Path:
    """`path` and its missing parents; `private` ones 0700 whatever the umask (a state
    file's folders: secrecy.py), else the umask's default (folders clients read)."""
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_FOLDER_MODE) if private else folder.mkdir()
        except FileExistsError:  # another process made it meanwhile
            continue
        if private:
            os.chmod(folder, PRIVATE_FOLDER_MODE)  # mkdir's mode passes through the umask
    return path


def write_atomically(
    path: Path,
    text: str | bytes | Iterable[bytes],
    *,
    mode: int = PRIVATE_MODE,
    durable: bool = True,
) -> None:
    """Write `text` (UTF-8 when a str; pieces of bytes, in order) to `path` atomically
    (see `write_at`, `mode` and `durable` too), creating the folder if needed.

    The temp name is random here: several processes may write files in one state folder.
    """
    with storage_errors(path):
        make_folders(path.parent, private=mode == PRIVATE_MODE)
        folder_fd = os.open(path.parent, _DIR_FLAGS)
    try:
        write_at(
            folder_fd,
            path.name,
            text.encode("utf-8") if isinstance(text, str) else text,
            tmp=hidden_name(path.name, unique=True),
            mode=mode,
            where=path,
            durable=durable,
        )
    finally:
        os.close(folder_fd)


def read_blocks(handle: BinaryIO, size: int) -> Iterator[bytes]:
    """What is left of an open file, `size` bytes at a time."""
    while block := handle.read(size):
        yield block


def fsync_file(path: Path) -> None:
    """Make a file written without `durable` durable: its bytes, then its folder's entry."""
    with storage_errors(path):
        for target, flags in ((path, os.O_RDONLY | os.O_CLOEXEC), (path.parent, _DIR_FLAGS)):
            fd = os.open(target, flags)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def json_bytes(data: Any) -> bytes:
    """Indented, key-sorted JSON (what people and programs read): `canonical`, built in one
    buffer (the standard library's pieces of a 20,000-issue receipt took 14 MB at once)."""
    return canonical(data)


def write_json(path: Path, data: Any, *, mode: int = PRIVATE_MODE) -> None:
    """Atomically write `data` as indented JSON (`mode` as in `write_at`)."""
    write_atomically(path, json_bytes(data), mode=mode)
