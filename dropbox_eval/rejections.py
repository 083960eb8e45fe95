"""RejectionLog: the recent rejections of dropped files, for the operator's page and metrics.

Append-only `state/rejections.jsonl`, one line per rejected file (reason, message, file,
client, time). It is bounded: past `max_bytes` it is renamed to `rejections.1.jsonl`
(replacing the older one), so at most two files are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

MAX_BYTES = 1024 * 1024
_FIELDS = ("reason", "message", "file", "client_id", "rejected_at", "limit")


class RejectionLog:
    """Appends and reads the rejection lines of one state folder."""

    def __init__(self, state_dir: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = state_dir / "rejections.jsonl"
        self.rotated = state_dir / "rejections.1.jsonl"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def append(self, document: dict[str, Any], client_id: str | None = None) -> None:
        """Record one rejection (the error document written beside the file)."""
        line = {key: document[key] for key in _FIELDS if document.get(key) is not None}
        line["client_id"] = client_id
        data = (json.dumps(line, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
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
        """Rejections per reason over the kept lines."""
        counts: dict[str, int] = {}
        for row in self._lines():
            reason = str(row.get("reason", "unknown"))
            counts[reason] = counts.get(reason, 0) + 1
        return counts
