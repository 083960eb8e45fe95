"""RejectionLog: the recent rejections of dropped files, for the operator's page and metrics.

Append-only `state/rejections.jsonl`, one line per rejected file (reason, message, file,
client, time). It is bounded: past `max_bytes` it is renamed to `rejections.1.jsonl`
(replacing the older one), so at most two files are kept. A rejection costs one appended
line and no durable write: the counts per reason are the lines' own, plus those of every
line rotated away, kept in `rejections.counts.json` (a mark: the counts up to an offset of
a lines file), written durably once per rotation, just before it. So they never drop on
rotation, and reading them costs the small mark and at most `max_bytes` of lines. A folder
from before the mark existed is counted from its kept lines; one whose counts file still
holds the totals of every line is turned into a mark at its next append.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from filelock import FileLock

from ..util.fileio import write_atomically

MAX_BYTES = 1024 * 1024
RejectionReason = Literal[
    "invalid_json",
    "invalid_encoding",
    "invalid_batch",
    "invalid_name",
    "missing_client_id",
    "client_mismatch",
    "reserved_client_id",
    "unknown_client",
    "client_disabled",
    "unfunded",
    "callback_refused",
    "too_large",
    "too_many_tasks",
    "symlink",
    "unknown_batch",
    "not_running",
    "use_retry",
]
REJECTION_REASONS: tuple[str, ...] = get_args(RejectionReason)
"""Every reason a dropped file is rejected for (README "File protocol" lists each)."""
_FIELDS = ("reason", "message", "file", "client_id", "rejected_at", "limit")
_REASON = re.compile(rb'^\{"reason":"([^"\\]*)"', re.MULTILINE)  # as `append` writes a line


@dataclass(frozen=True)
class Mark:
    """The rejections counted so far: every line rotated away, and the first `offset`
    bytes of the lines file whose inode is `inode` (none of the current one when it is
    another file)."""

    counts: dict[str, int] = field(default_factory=dict)
    inode: int | None = None
    offset: int = 0


class RejectionLog:
    """Appends and reads the rejection lines of one state folder."""

    def __init__(self, state_dir: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = state_dir / "rejections.jsonl"
        self.rotated = state_dir / "rejections.1.jsonl"
        self.max_bytes = max_bytes
        self.counts_path = state_dir / "rejections.counts.json"
        self._lock = threading.Lock()
        self._file_lock = FileLock(str(state_dir / "rejections.lock"), mode=0o600)

    def append(self, document: dict[str, Any], client_id: str | None = None) -> None:
        """Record one rejection (the error document written beside the file): one line,
        appended; the durable writes come once per rotation."""
        line = {key: document[key] for key in _FIELDS if document.get(key) is not None}
        line["client_id"] = client_id
        data = (json.dumps(line, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock, self._file_lock:
            mark = self._mark(convert=True)
            with contextlib.suppress(FileNotFoundError):
                info = self.path.stat()
                if info.st_size + len(data) > self.max_bytes:
                    self._rotate(mark)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, data)  # one write with O_APPEND: lines never interleave
            finally:
                os.close(fd)

    def _rotate(self, mark: Mark) -> None:
        """Mark the lines file counted to its end (durably), then rename it away: a kill
        in between leaves it marked as counted, and the next append rotates it."""
        counts, inode, size = self._counted(mark)
        self._write_mark(Mark(counts, inode, size))
        os.replace(self.path, self.rotated)

    def _lines(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for path in (self.rotated, self.path):
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                with contextlib.suppress(ValueError):  # a line cut short by a crash
                    rows.append(json.loads(line))
        return rows

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest rejections first."""
        return list(reversed(self._lines()))[:limit]

    def counts(self) -> dict[str, int]:
        """Rejections per reason since the state folder began."""
        with self._lock, self._file_lock:
            return self._counted(self._mark(convert=False))[0]

    def _counted(self, mark: Mark) -> tuple[dict[str, int], int | None, int]:
        """The mark's counts with the lines of the current file it has not counted; that
        file's inode and size (None, 0 when there is none)."""
        counts = dict(mark.counts)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return counts, None, 0
        try:
            info = os.fstat(fd)
            start = mark.offset if info.st_ino == mark.inode else 0
            data = os.pread(fd, max(0, info.st_size - start), start)
        finally:
            os.close(fd)
        _add_lines(counts, data)
        return counts, info.st_ino, info.st_size

    def _mark(self, *, convert: bool) -> Mark:
        """The stored mark. Without one: the kept lines counted (a folder from before the
        counts), or an older counts file's totals as a mark of the current file to its end;
        with `convert`, stored as the mark (once: lines appended later count from it)."""
        try:
            stored = json.loads(self.counts_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            stored = None
        if isinstance(stored, dict) and "counts" in stored:
            counts = {str(reason): int(n) for reason, n in stored["counts"].items()}
            return Mark(counts, stored.get("inode"), int(stored.get("offset", 0)))
        if isinstance(stored, dict):  # the totals of every line, the current file's too
            totals = {str(reason): int(n) for reason, n in stored.items()}
            try:
                info = self.path.stat()
            except FileNotFoundError:
                mark = Mark(totals)
            else:
                mark = Mark(totals, info.st_ino, info.st_size)
        else:
            counts = {}
            with contextlib.suppress(FileNotFoundError):
                _add_lines(counts, self.rotated.read_bytes())
            mark = Mark(counts)  # and every line of the current file
        if convert:
            self._write_mark(mark)
        return mark

    def _write_mark(self, mark: Mark) -> None:
        document = {"counts": mark.counts, "inode": mark.inode, "offset": mark.offset}
        write_atomically(self.counts_path, json.dumps(document, sort_keys=True))


def _add_lines(counts: dict[str, int], data: bytes) -> None:
    """Count the whole lines of `data` by reason into `counts` (a line cut short by a
    crash is not one; a line without a reason is `unknown`)."""
    data = data[: data.rfind(b"\n") + 1]
    reasons = _REASON.findall(data)
    for reason in reasons:
        key = reason.decode("utf-8", "replace")
        counts[key] = counts.get(key, 0) + 1
    unknown = data.count(b"\n") - len(reasons)
    if unknown:
        counts["unknown"] = counts.get("unknown", 0) + unknown
