"""Accounting of the SFTP endpoint: one log line per session start and end, and per file.

Each line names the client, its key fingerprint and the source address. An uploaded
`.json` file gets a second line with its batch id (or the rejection) once the service has
filed it, found best-effort by the sha256 in the receipt or error file for a minute. One
lookup per client folder serves all its files waiting for that line, and it reads receipts
only when `accepted/` or `rejected/` has changed: a file waiting costs nothing while the
service files nothing.
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

from ..util.names import OUTCOME_DIRS
from .paths import DIR_FLAGS

log = logging.getLogger("dropbox_eval")

BATCH_LOOKUP_SECONDS = 60.0
BATCH_LOOKUP_EVERY = 0.25
RECENT_SECONDS = 2.0  # a folder changed this recently may change again within its mtime tick


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
        self._lookups: dict[str, _FolderLookup] = {}

    def done(
        self, session: Session, name: str, size: int, outcome: str, digest: str | None
    ) -> None:
        """One upload ended (`digest`: the sha256 of a completed file)."""
        session.files += 1
        session.bytes += size
        log.info("sftp file: %s file=%s bytes=%d outcome=%s", session.who(), name, size, outcome)
        if digest is not None and name.lower().endswith(".json"):
            lookup = self._lookups.get(session.client_id)
            if lookup is None:
                lookup = _FolderLookup(self.inbox / session.client_id)
                self._lookups[session.client_id] = lookup
            lookup.add(_Waiting(session, name, digest))


@dataclass
class _Waiting:
    session: Session
    name: str
    digest: str
    until: float = field(default_factory=lambda: time.monotonic() + BATCH_LOOKUP_SECONDS)


class _FolderLookup:
    """The files of one client folder waiting for their batch line, and the one task that
    looks for them while any wait."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.waiting: list[_Waiting] = []
        self._seen: dict[str, tuple[int, int] | None] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, item: _Waiting) -> None:
        self.waiting.append(item)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.waiting:
            if self._changed():
                self.waiting = [item for item in self.waiting if not _found(self.folder, item)]
            now = time.monotonic()
            for item in (item for item in self.waiting if item.until <= now):
                log.info(
                    "sftp file: %s file=%s batch=unknown (no receipt with its sha256 within "
                    "%.0f s)",
                    item.session.who(),
                    item.name,
                    BATCH_LOOKUP_SECONDS,
                )
            self.waiting = [item for item in self.waiting if item.until > now]
            await asyncio.sleep(BATCH_LOOKUP_EVERY)

    def _changed(self) -> bool:
        """Whether `accepted/` or `rejected/` may hold a receipt not looked at yet."""
        changed = False
        for outcome in OUTCOME_DIRS:
            try:
                info = os.stat(self.folder / outcome, follow_symlinks=False)
            except OSError:
                signature = None
            else:
                signature = (info.st_ino, info.st_mtime_ns)
                changed |= time.time() - info.st_mtime < RECENT_SECONDS
            changed |= self._seen.get(outcome, (-1, -1)) != signature
            self._seen[outcome] = signature
        return changed


def _found(folder: Path, item: _Waiting) -> bool:
    found = find_outcome(folder, item.name, item.digest)
    if found is not None:
        log.info("sftp file: %s file=%s %s", item.session.who(), item.name, found)
    return found is not None


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
