"""Accounting of the SFTP endpoint: one log line per session start and end, and per file.

Each line names the client, its key fingerprint and the source address. An uploaded
`.json` file gets a second line with its batch id (or the rejection) once the service has
filed it, found best-effort by the sha256 in the receipt or error file for a minute.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .paths import DIR_FLAGS

log = logging.getLogger("dropbox_eval")

BATCH_LOOKUP_SECONDS = 60.0
BATCH_LOOKUP_EVERY = 0.25


@dataclass
class Session:
    """One authenticated connection, for the accounting lines."""

    client_id: str
    fingerprint: str
    peer: str
    started: float = field(default_factory=time.monotonic)
    files: int = 0
    bytes: int = 0

    def who(self) -> str:
        """`client=... key=... from=...` for log lines."""
        return f"client={self.client_id} key={self.fingerprint} from={self.peer}"


class FileLog:
    """Logs each finished upload of the endpoint's sessions, and then its batch."""

    def __init__(self, inbox: Path) -> None:
        """Receipts are looked up in `inbox/<client>/accepted` and `rejected`."""
        self.inbox = inbox
        self._lookups: set[asyncio.Task[None]] = set()

    def done(
        self, session: Session, name: str, size: int, outcome: str, digest: str | None
    ) -> None:
        """One upload ended (`digest`: the sha256 of a completed file)."""
        session.files += 1
        session.bytes += size
        log.info("sftp file: %s file=%s bytes=%d outcome=%s", session.who(), name, size, outcome)
        if digest is not None and name.lower().endswith(".json"):
            task = asyncio.get_running_loop().create_task(self._log_batch(session, name, digest))
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)

    async def _log_batch(self, session: Session, name: str, digest: str) -> None:
        """Log the batch id (or rejection) once the service has filed the upload."""
        folder = self.inbox / session.client_id
        deadline = time.monotonic() + BATCH_LOOKUP_SECONDS
        while time.monotonic() < deadline:
            found = find_outcome(folder, name, digest)
            if found is not None:
                log.info("sftp file: %s file=%s %s", session.who(), name, found)
                return
            await asyncio.sleep(BATCH_LOOKUP_EVERY)
        log.info(
            "sftp file: %s file=%s batch=unknown (no receipt with its sha256 within %.0f s)",
            session.who(),
            name,
            BATCH_LOOKUP_SECONDS,
        )


def find_outcome(folder: Path, name: str, digest: str) -> str | None:
    """`batch=<id>` or `rejected=<reason>` if the service filed an upload with this sha256."""
    for outcome, suffix in (("accepted", ".receipt.json"), ("rejected", ".error.json")):
        document = _read_json_nofollow(folder, outcome, f"{name}{suffix}")
        if document is None or document.get("sha256") != digest:
            continue
        if outcome == "accepted":
            return f"batch={document.get('batch_id')}"
        return f"rejected={document.get('reason') or document.get('error')}"
    return None


def _read_json_nofollow(folder: Path, outcome: str, name: str) -> dict[str, Any] | None:
    try:
        folder_fd = os.open(folder / outcome, DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None
    finally:
        os.close(folder_fd)
    return data if isinstance(data, dict) else None
