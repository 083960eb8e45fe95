"""ReadinessTracker: when a dropped file is complete enough to read."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .fsops import FILE_FLAGS, kind

log = logging.getLogger("dropbox_eval")

Signature = tuple[int, int, int, int, int]
"""What must stay unchanged for a file to be ready: dev, inode, size, mtime_ns, ctime_ns."""


def signature(info: os.stat_result) -> Signature:
    """The readiness signature of a stat result."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


@dataclass
class _Seen:
    signature: Signature
    stable_since: float


class ReadinessTracker:
    """A file is ready when its signature stayed unchanged for the quiet period.

    Watchdog events and rescans only `touch` paths; such an event is a wake-up, never proof
    of completeness (an interrupted upload closes its file too). The clock is monotonic and
    starts when we first see a signature, so neither an old mtime (cp -p, rsync -t, a file
    moved in from elsewhere) nor a clock step can make a file look ready early.

    The one exception is `renamed`: a rename within the inbox from a temporary or hidden name
    (`x.json.part`, `.x.json.AbC123`) to a candidate name is atomic, and an interrupted upload
    never renames, so that file is ready at the next look without the quiet period - as long
    as it is still a regular file with the signature (inode, size, mtime, ctime) it had right
    after the rename. Any other event on the path (`changed`) withdraws that, and so does any
    difference in the signature: the file then waits the quiet period like any other.

    With `per_group`, at most that many paths of one group (a client's folder, `group_of`)
    are tracked at once: a path beyond it is not taken (it stays on disk), and `refill_due`
    says when a group that overflowed has room again, for a rescan to bring the rest.
    """

    def __init__(
        self,
        quiet_period: float,
        *,
        group_of: Callable[[Path], str] = lambda _path: "",
        per_group: int | None = None,
    ) -> None:
        self.quiet_period = quiet_period
        self.group_of = group_of
        self.per_group = per_group
        self._counts: dict[str, int] = {}  # tracked paths per group
        self._groups: dict[Path, str] = {}  # each tracked path's group, asked once
        self._overflowed: set[str] = set()  # groups that had a path refused
        self._seen: dict[Path, _Seen | None] = {}
        self._renamed: dict[Path, Signature] = {}
        self._events: dict[Path, int] = {}  # per touch; one during a check keeps the path
        self._ignored: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def touch(self, path: Path) -> bool:
        """Remember a path to check (thread-safe; called from the observer thread); False
        when its group has as many tracked as it may."""
        with self._lock:
            return self._touch(path)

    def changed(self, path: Path) -> bool:
        """An event other than a rename into place: check the path, with the quiet period."""
        with self._lock:
            self._renamed.pop(path, None)
            return self._touch(path)

    def renamed(self, path: Path) -> bool:
        """A rename from a temporary or hidden name put `path` in place: complete at once.

        Called from the observer thread as the move event arrives; the signature seen now is
        the one the file must still have when it is read.
        """
        try:
            info = path.lstat()
        except OSError:
            info = None
        with self._lock:
            taken = self._touch(path)
            if taken and info is not None and stat.S_ISREG(info.st_mode):
                self._renamed[path] = signature(info)
            else:
                self._renamed.pop(path, None)
            return taken

    def _touch(self, path: Path) -> bool:
        if path not in self._seen:
            group = self.group_of(path)
            count = self._counts.get(group, 0)
            if self.per_group is not None and count >= self.per_group:
                self._overflowed.add(group)
                return False
            self._counts[group] = count + 1
            self._groups[path] = group
            self._seen[path] = None
        self._events[path] = self._events.get(path, 0) + 1
        return True

    def _forget(self, path: Path) -> None:
        if path in self._seen:
            del self._seen[path]
            group = self._groups.pop(path)
            self._counts[group] -= 1
            if not self._counts[group]:
                del self._counts[group]
        self._events.pop(path, None)
        self._renamed.pop(path, None)

    def refill_due(self) -> bool:
        """Whether a group that had paths refused is down to half its share (then its
        rest on disk can be looked for again); each overflow is answered once."""
        with self._lock:
            limit = (self.per_group or 0) // 2
            due = {group for group in self._overflowed if self._counts.get(group, 0) <= limit}
            self._overflowed -= due
            return bool(due)

    def overflowed(self) -> bool:
        """Whether some group had paths refused that no rescan brought back yet."""
        with self._lock:
            return bool(self._overflowed)

    def pending(self) -> int:
        """How many paths are being watched for readiness."""
        with self._lock:
            return len(self._seen)

    def ready(
        self, now: float | None = None, wanted: Callable[[Path], bool] | None = None
    ) -> Iterator[Path]:
        """Yield the paths that are ready, each checked again just before it is yielded.

        A yielded path is no longer tracked; vanished and non-regular paths are dropped
        (an event or the next rescan brings them back). Checking lazily means a file that a
        writer resumed while earlier files were being processed is not read half-written.
        A path touched again while it was being checked stays tracked for another look.
        A path `wanted` declines (asked just before its check) stays tracked, unchecked.
        """
        with self._lock:
            paths = sorted(self._seen, key=str)  # str: a path's own order costs 10 x more
        for path in paths:
            if wanted is not None and not wanted(path):
                continue
            moment = time.monotonic() if now is None else now
            with self._lock:
                events = self._events.get(path)
            verdict = self._check(path, moment)
            if verdict is None:
                continue
            with self._lock:
                if self._events.get(path) == events:
                    self._forget(path)
            if verdict:
                yield path

    def _check(self, path: Path, moment: float) -> bool | None:
        """True = ready, False = forget it, None = keep waiting."""
        with self._lock:
            moved = self._renamed.pop(path, None)
        try:
            info = path.lstat()
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            return True  # refused by the inbox straight away; waiting would not change it
        if not stat.S_ISREG(info.st_mode):
            self._note_ignored(path, info)
            return False
        current = signature(info)
        if moved is not None and moved == current and _fresh_signature(path) == current:
            return True  # the very file a rename put in place, untouched since: complete
        with self._lock:
            seen = self._seen.get(path)
            if seen is None or seen.signature != current:
                self._seen[path] = _Seen(current, moment)
                if self.quiet_period > 0:
                    return None
                return True
        if moment - seen.stable_since < self.quiet_period:
            return None
        fresh = _fresh_signature(path)
        if fresh is None:
            return False
        if fresh != current:  # a cached view (NFS attribute cache) hid a change
            with self._lock:
                self._seen[path] = _Seen(fresh, moment)
            return None
        return True

    def _note_ignored(self, path: Path, info: os.stat_result) -> None:
        key = (info.st_ino, stat.S_IFMT(info.st_mode))
        with self._lock:
            if self._ignored.get(path) == key:
                return
            self._ignored[path] = key
        log.warning("file %s: not a regular file (%s); ignored", path, kind(info.st_mode))


def _fresh_signature(path: Path) -> Signature | None:
    """Signature from an open descriptor (an open revalidates network-share attribute caches).

    None when the path vanished or is no longer a regular file. An unreadable file returns
    a signature from lstat so that the inbox reports it (and retries it later).
    """
    try:
        fd = os.open(path, FILE_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:
        try:
            info = path.lstat()
        except OSError:
            return None
        return signature(info) if stat.S_ISREG(info.st_mode) else None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return signature(info) if stat.S_ISREG(info.st_mode) else None
