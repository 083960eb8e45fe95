"""RejectionLog: the recent rejections of dropped files, for the operator's page and metrics.

Append-only `state/rejections.jsonl`, one line per rejected file (reason, message, file,
client, time). It is bounded: past `max_bytes` it is renamed to `rejections.1.jsonl`
(replacing the older one), so at most two files are kept. The counts per reason are kept
apart, in `rejections.counts.json`, raised with each line under a file lock: they never
drop on rotation and reading them costs one small file (a folder from before they existed
is counted from its kept lines once).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
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


class RejectionLog:
    """Appends and reads the rejection lines of one state folder."""

    def __init__(self, state_dir: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = state_dir / "rejections.jsonl"
        self.rotated = state_dir / "rejections.1.jsonl"
        self.max_bytes = max_bytes
        self.counts_path = state_dir / "rejections.counts.json"
        self._lock = threading.Lock()
        self._file_lock = FileLock(str(state_dir / "rejections.lock"))

    def append(self, document: dict[str, Any], client_id: str | None = None) -> None:
        """Record one rejection (the error document written beside the file)."""
        line = {key: document[key] for key in _FIELDS if document.get(key) is not None}
        line["client_id"] = client_id
        data = (json.dumps(line, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock, self._file_lock:
            counts = self._kept_counts()
            reason = str(line.get("reason", "unknown"))
            counts[reason] = counts.get(reason, 0) + 1
            write_atomically(self.counts_path, json.dumps(counts, sort_keys=True))
            with contextlib.suppress(FileNotFoundError):
                if self.path.stat().st_size + len(data) > self.max_bytes:
                    os.replace(self.path, self.rotated)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, data)  # one write with O_APPEND: lines never interleave
            finally:
                os.close(fd)

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
        """Rejections per reason since the state folder began (one small file)."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            return self._read_counts()
        with self._lock, self._file_lock:
            counts = self._kept_counts()
            write_atomically(self.counts_path, json.dumps(counts, sort_keys=True))
            return counts

    def _kept_counts(self) -> dict[str, int]:
        """The kept counts; first counted from the kept lines (the caller holds the locks)."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            return self._read_counts()
        counts: dict[str, int] = {}
        for row in self._lines():
            reason = str(row.get("reason", "unknown"))
            counts[reason] = counts.get(reason, 0) + 1
        return counts

    def _read_counts(self) -> dict[str, int]:
        data = json.loads(self.counts_path.read_text(encoding="utf-8"))
        return {str(reason): int(count) for reason, count in data.items()}
