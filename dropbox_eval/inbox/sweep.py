"""Uploads nobody finished: names the inbox never reads, removed once they stop changing.

A temporary name (`*.part`, `*.tmp`, `*.filepart`, ...), a hidden one (rsync's
`.name.XXXXXX`, lftp's `.in.name`, the SFTP endpoint's `.sftp-*`) or any other name not
ending in `.json` is left alone until it is renamed into place. An upload that was never
renamed would stay for ever and fill the disk every client's inbox, the state and the
outbox share. So such a file, at the top of the inbox or in a client folder, is removed
once neither its contents nor its metadata changed for SAAS_EVAL_STALE_UPLOAD_SECONDS
(24 h by default), and each removal is logged. Times are the file's own mtime and ctime:
a copy that kept an old mtime (`put -p`) still has a fresh ctime. Filed drops in
`accepted/` and `rejected/` are never touched, nor are links, folders and NFS's `.nfs*`
files (an open file deleted on another host).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import storage_error
from .scan import dropped_entries, is_candidate_name

log = logging.getLogger("dropbox_eval")

MAX_SWEEP_EVERY = 600.0  # seconds; a sweep lists every client folder


class StaleUploads:
    """Removes files of the inbox that are never read and stopped changing long ago."""

    def __init__(self, root: Path, max_age: float, clock: Callable[[], float] = time.time) -> None:
        """`max_age` is SAAS_EVAL_STALE_UPLOAD_SECONDS."""
        self.root = root
        self.max_age = max_age
        self.clock = clock
        self.every = min(max_age / 2, MAX_SWEEP_EVERY)
        self._next = 0.0

    def sweep_if_due(self) -> list[Path]:
        """Sweep unless the last sweep was less than `every` seconds ago; what was removed."""
        now = time.monotonic()  # a wall clock stepped back must not hold the sweeps
        if now < self._next:
            return []
        self._next = now + self.every
        return self.sweep()

    def sweep(self) -> list[Path]:
        """Remove every stale upload present now; returns their paths."""
        removed = []
        for entry in dropped_entries(self.root):
            path = Path(entry.path)
            if is_candidate_name(self.root, path) or entry.name.startswith(".nfs"):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and self._stale(info) and _remove_if_same(path, info):
                removed.append(path)
                log.warning(
                    "inbox: removed %s: a temporary upload never renamed into place, "
                    "unchanged for %.0f s (%d bytes; SAAS_EVAL_STALE_UPLOAD_SECONDS=%.0f)",
                    path.relative_to(self.root),
                    self.clock() - max(info.st_mtime, info.st_ctime),
                    info.st_size,
                    self.max_age,
                )
        return removed

    def _stale(self, info: os.stat_result) -> bool:
        return self.clock() - max(info.st_mtime, info.st_ctime) > self.max_age


def _remove_if_same(path: Path, seen: os.stat_result) -> bool:
    """Unlink `path` if it is still the file `seen` describes, unchanged since."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    same = (now.st_ino, now.st_dev, now.st_mtime_ns, now.st_ctime_ns) == (
        seen.st_ino,
        seen.st_dev,
        seen.st_mtime_ns,
        seen.st_ctime_ns,
    )
    if not same:
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:  # a read-only or refused folder: said, and the sweep goes on
        log.warning("stale upload %s left: %s", path, storage_error(exc, path) or exc)
        return False
    return True
