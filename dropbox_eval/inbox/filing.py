"""Filing a drop away: `accepted/` or `rejected/` beside it, the receipt or error file
first, then the very file that was read moved next to it (all relative to descriptors)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from ..protocol.documents import Filing
from ..util.fileio import SHARED_MODE, json_bytes, write_at
from . import fsops

log = logging.getLogger("dropbox_eval")
OUTCOME_SUFFIX = {"accepted": ".receipt.json", "rejected": ".error.json"}


class Skip(Exception):
    """The file cannot be handled now; it stays where it is (no receipt, no error file)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def outcome_folder(folder_fd: int, path: Path, outcome: str) -> int:
    """Open (creating it if needed) `accepted/` or `rejected/` without following links."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(outcome, 0o777, dir_fd=folder_fd)  # umask applies
    try:
        return os.open(outcome, fsops.DIR_FLAGS, dir_fd=folder_fd)
    except OSError as exc:
        raise unusable_outcome_folder(path, outcome, exc) from exc


def file_away(
    folder_fd: int, path: Path, outcome: str, document: Filing, fd: int | None
) -> Path | None:
    """Write the receipt/error file, then move the drop beside it (receipt first, so a
    client that sees its file moved also sees why). Only the file that was read (`fd`)
    is moved: a new upload that took its name meanwhile stays in the inbox. `document`
    gets `filed_as` when the drop's name was taken."""
    suffix = OUTCOME_SUFFIX[outcome]
    out_fd = outcome_folder(folder_fd, path, outcome)
    try:
        dumped = document.document()  # once: a big batch's receipt lists every task
        target = fsops.choose_target(out_fd, path.name, suffix, dumped, fd)
        if target != path.name:
            document.filed_as = target
            dumped = document.document()
        name = f"{target}{suffix}"
        where = path.parent / outcome / name
        # The outcome folder is synced once, after the move: both new entries in one sync,
        # the receipt's first (a journaling filesystem commits them in the order made).
        document_bytes = json_bytes(dumped)
        del dumped
        write_at(out_fd, name, document_bytes, mode=SHARED_MODE, where=where, sync_folder=False)
        if not fsops.move_opened(fd, folder_fd, path.name, out_fd, target):
            log.warning("file %s: vanished while being filed as %s", shown(path), outcome)
            if outcome == "rejected":
                with contextlib.suppress(OSError):
                    os.unlink(f"{target}{suffix}", dir_fd=out_fd)
            os.fsync(out_fd)
            return None
        os.fsync(out_fd)
        os.fsync(folder_fd)
    finally:
        os.close(out_fd)
    return path.parent / outcome / target


def check_outcome_folder(folder_fd: int, path: Path, outcome: str) -> None:
    try:
        info = os.stat(outcome, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise unusable_outcome_folder(path, outcome, fsops.kind(info.st_mode))


def unusable_outcome_folder(path: Path, outcome: str, why: object) -> Skip:
    return Skip(
        "outcome_folder_unusable",
        f"{path.parent / outcome} is not a plain folder "
        f"({why}); nothing is filed through it, the file stays where it is",
    )


def shown(path: Path) -> str:
    """A path as log lines can carry it: bytes that are not UTF-8 as `\\x..` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
