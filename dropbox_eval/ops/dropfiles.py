"""The files a batch leaves outside the state folder, and the old ones of the inbox's
`accepted/` and `rejected/` folders: what a delete and the retention prune remove there.

A client's folder is the client's (it uploads there), so nothing here follows a link:
each folder is opened without following one, and names are removed relative to it. A
filed drop's age is its status-change time (ctime): filing renames it, which sets it, and
no client can set it back (a drop's mtime is whatever the upload tool kept).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..util.names import UNDELIVERED_DIR

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
RECEIPT = ".receipt.json"
ERROR = ".error.json"
READ_LIMIT = 1 << 20  # a receipt is a few hundred bytes


def report_files(outbox: Path, batch_id: str) -> list[Path]:
    """A batch's report in the outbox (and its JSON Lines twin), and the copy kept while
    its callback failed."""
    found = [
        folder / f"{batch_id}{suffix}"
        for folder in (outbox, outbox / UNDELIVERED_DIR)
        for suffix in (".json", ".jsonl")
    ]
    return [path for path in found if path.is_file() and not path.is_symlink()]


def filed_drop(inbox: Path, source: str | None, batch_id: str) -> list[Path]:
    """The accepted drop a batch was read from and its receipt (by the receipt naming the
    batch: under the name it was dropped as, else one it was filed under)."""
    if not source or "." not in source or ".." in Path(source).parts:
        return []  # the API's or a retry's: no drop
    where = Path(source)
    folder = inbox / where.parent / "accepted"
    names = [where.name] + [
        name.removesuffix(RECEIPT)
        for name in _names(folder)
        if name.endswith(RECEIPT) and name.startswith(where.stem) and name != where.name + RECEIPT
    ]
    for name in names:
        receipt = _read_json(folder, name + RECEIPT)
        if receipt is not None and receipt.get("batch_id") == batch_id:
            return [folder / (name + RECEIPT), folder / name]
    return []


def old_filed(inbox: Path, cutoff: float) -> list[Path]:
    """Rejected drops and their error files, and accepted cancel requests and their
    receipts, filed before `cutoff` (seconds since the epoch), at the top of the inbox and
    in every client folder. Accepted batches go with their batch (`filed_drop`)."""
    found: list[Path] = []
    for folder in [inbox, *(inbox / name for name in _names(inbox, folders=True))]:
        rejected = folder / "rejected"
        found += [rejected / name for name in _names(rejected) if _older(rejected / name, cutoff)]
        accepted = folder / "accepted"
        for name in _names(accepted):
            if name.endswith(RECEIPT) and _older(accepted / name, cutoff):
                receipt = _read_json(accepted, name)
                if receipt is not None and receipt.get("cancel") is True:
                    found += [accepted / name, accepted / name.removesuffix(RECEIPT)]
    return found


def remove(paths: list[Path]) -> int:
    """Remove each file (never a link's target: relative to its folder opened without
    following links); returns how many were there."""
    removed = 0
    for path in paths:
        with _folder(path.parent) as fd:
            if fd is None:
                continue
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(path.name, dir_fd=fd)
                removed += 1
    return removed


@contextlib.contextmanager
def _folder(path: Path) -> Iterator[int | None]:
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _names(path: Path, *, folders: bool = False) -> list[str]:
    """The regular files (or the folders) in `path`, links left out; [] when it is not a
    folder."""
    with _folder(path) as fd:
        if fd is None:
            return []
        with os.scandir(fd) as entries:
            wanted = stat.S_ISDIR if folders else stat.S_ISREG
            chosen = []
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    if wanted(entry.stat(follow_symlinks=False).st_mode):
                        chosen.append(entry.name)
            return sorted(chosen)


def _older(path: Path, cutoff: float) -> bool:
    try:
        return os.lstat(path).st_ctime < cutoff
    except FileNotFoundError:
        return False


def _read_json(folder: Path, name: str) -> dict[str, object] | None:
    with _folder(folder) as fd:
        if fd is None:
            return None
        try:
            handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            with os.fdopen(handle, "rb") as opened:
                data = json.loads(opened.read(READ_LIMIT))
        except (OSError, ValueError):
            return None
    return data if isinstance(data, dict) else None
