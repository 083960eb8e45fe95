"""The drop folder: which files are candidates, when they are ready, and where they end up.

Every dropped file ends in exactly one of `accepted/` (with `<name>.receipt.json`) or
`rejected/` (with `<name>.error.json`), beside where it was dropped. The original bytes are
moved, never rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import BatchRejected
from .fileio import fsync_dir, write_json
from .intake import EvalIntake, rejection_from_validation
from .models import ID_PATTERN, BatchFile, utcnow

log = logging.getLogger("dropbox_eval")

OUTCOME_DIRS = ("accepted", "rejected")
TEMP_SUFFIXES = (".filepart", ".part", ".tmp", ".writing", ".partial", ".crdownload")


def is_candidate_name(root: Path, path: Path) -> bool:
    """A `.json` file in the inbox or one client folder below it, not hidden or temporary."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return False
    if not parts or len(parts) > 2 or any(p.startswith(".") for p in parts):
        return False
    if len(parts) == 2 and parts[0] in OUTCOME_DIRS:
        return False
    name = parts[-1]
    return name.endswith(".json") and not name.endswith(TEMP_SUFFIXES)


@dataclass
class _Seen:
    size: int
    mtime_ns: int
    stable_since: float


class ReadinessTracker:
    """A file is ready when its size and mtime stayed unchanged for the quiet period.

    Watchdog events and rescans only `touch` paths; they are never proof of completeness.
    """

    def __init__(self, quiet_period: float) -> None:
        self.quiet_period = quiet_period
        self._seen: dict[Path, _Seen | None] = {}
        self._lock = threading.Lock()

    def touch(self, path: Path) -> None:
        """Remember a path to check (thread-safe; called from the observer thread)."""
        with self._lock:
            self._seen.setdefault(path, None)

    def pending(self) -> int:
        """How many paths are being watched for readiness."""
        with self._lock:
            return len(self._seen)

    def ready(self, now: float | None = None) -> list[Path]:
        """Paths that are ready now (removed from tracking); vanished paths are dropped."""
        moment = time.monotonic() if now is None else now
        with self._lock:
            paths = list(self._seen)
        result = []
        for path in paths:
            verdict = self._check(path, moment)
            if verdict is not None:
                with self._lock:
                    self._seen.pop(path, None)
                if verdict:
                    result.append(path)
        return sorted(result)

    def _check(self, path: Path, moment: float) -> bool | None:
        """True = ready, False = forget it, None = keep waiting."""
        try:
            info = path.lstat()
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            return True  # refused by the inbox straight away; waiting would not change it
        if not stat.S_ISREG(info.st_mode):
            return False
        with self._lock:
            seen = self._seen.get(path)
            if seen is None or (seen.size, seen.mtime_ns) != (info.st_size, info.st_mtime_ns):
                self._seen[path] = _Seen(info.st_size, info.st_mtime_ns, moment)
                return None if self.quiet_period > 0 else True
        return True if moment - seen.stable_since >= self.quiet_period else None


@dataclass
class Outcome:
    """What happened to one dropped file."""

    status: str  # accepted | rejected | skipped
    path: Path | None
    document: dict[str, Any]


class Inbox:
    """Turns ready files into batches via the intake, and files them away."""

    def __init__(self, root: Path, intake: EvalIntake, max_file_bytes: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.intake = intake
        self.max_file_bytes = max_file_bytes

    def scan(self) -> list[Path]:
        """Every candidate file present now (start-up and periodic rescans)."""
        found: list[Path] = []
        for pattern in ("*.json", "*/*.json"):
            found.extend(p for p in self.root.glob(pattern) if is_candidate_name(self.root, p))
        return sorted(found)

    def client_folder(self, path: Path) -> str | None:
        """The client id fixed by a per-client folder, if the file sits in one."""
        parts = path.relative_to(self.root).parts
        return parts[0] if len(parts) == 2 else None

    def process(self, path: Path) -> Outcome:
        """Accept or reject one ready file; never raises for bad input."""
        if not is_candidate_name(self.root, path):
            return Outcome("skipped", None, {"reason": "not an inbox candidate"})
        log.info("file %s: seen", path)
        try:
            raw = self._read(path)
        except FileNotFoundError:
            return Outcome("skipped", None, {"reason": "vanished"})
        except BatchRejected as exc:
            return self._reject(path, exc, None)
        except OSError as exc:
            log.warning("file %s: cannot read, will retry: %s", path, exc)
            return Outcome("skipped", None, {"reason": "unreadable", "message": str(exc)})
        sha256 = hashlib.sha256(raw).hexdigest()
        try:
            batch, client_id = self._parse(path, raw)
            result = self.intake.accept(batch, client_id, source=str(path.relative_to(
                self.root)), sha256=sha256)
        except BatchRejected as exc:
            return self._reject(path, exc, sha256)
        return self._accept(path, result, client_id, sha256)

    def _read(self, path: Path) -> bytes:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if path.is_symlink():
                raise BatchRejected("symlink", "symbolic links are refused; upload the file "
                                    "itself") from exc
            raise
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise FileNotFoundError(path)
            if info.st_size > self.max_file_bytes:
                raise BatchRejected("too_large", f"file is {info.st_size} bytes; the limit is "
                                    f"{self.max_file_bytes}", limit=self.max_file_bytes)
            return handle.read(self.max_file_bytes + 1)

    def _parse(self, path: Path, raw: bytes) -> tuple[BatchFile, str]:
        if not raw.strip():
            raise BatchRejected("invalid_json", "the file is empty")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise BatchRejected("invalid_encoding", f"file is not UTF-8 (byte {exc.start})"
                                ) from exc
        try:
            document = json.loads(text)
        except RecursionError as exc:
            raise BatchRejected("invalid_json", "JSON is nested too deeply") from exc
        except json.JSONDecodeError as exc:
            raise BatchRejected("invalid_json", f"not valid JSON: {exc.msg} at line "
                                f"{exc.lineno} column {exc.colno}", line=exc.lineno,
                                column=exc.colno) from exc
        if not isinstance(document, dict):
            raise BatchRejected("invalid_batch", "the document must be a JSON object",
                                field="(document)")
        try:
            batch = BatchFile.model_validate(document)
        except ValidationError as exc:
            raise rejection_from_validation(exc) from exc
        folder_client = self.client_folder(path)
        client_id = folder_client or batch.client_id
        if client_id is None:
            raise BatchRejected("missing_client_id", "client_id is required for files dropped "
                                "at the top of the inbox", field="client_id")
        if folder_client is not None and not _valid_id(folder_client):
            raise BatchRejected("invalid_batch", f"folder name {folder_client!r} is not a "
                                "valid client id", field="client_id")
        return batch, client_id

    def _accept(self, path: Path, result: dict[str, Any], client_id: str,
                sha256: str) -> Outcome:
        receipt = {**result, "client_id": client_id, "sha256": sha256, "file": path.name,
                   "accepted_at": utcnow().isoformat()}
        final = self._file_away(path, "accepted", receipt, ".receipt.json")
        log.info("file %s: accepted as batch %s%s", path, result["batch_id"],
                 " (duplicate of an earlier drop)" if result.get("duplicate") else "")
        return Outcome("accepted", final, receipt)

    def _reject(self, path: Path, error: BatchRejected, sha256: str | None) -> Outcome:
        document = {**error.as_dict(), "file": path.name, "sha256": sha256,
                    "rejected_at": utcnow().isoformat()}
        final = self._file_away(path, "rejected", document, ".error.json")
        log.warning("file %s: rejected (%s): %s", path, error.reason, error.message)
        return Outcome("rejected", final, document)

    def _file_away(self, path: Path, outcome: str, document: dict[str, Any],
                   suffix: str) -> Path:
        folder = path.parent / outcome
        folder.mkdir(exist_ok=True)
        target = _free_name(folder, path.name)
        write_json(folder / f"{target.name}{suffix}", document)
        os.rename(path, target)
        fsync_dir(folder)
        fsync_dir(path.parent)
        return target


def _free_name(folder: Path, name: str) -> Path:
    target = folder / name
    counter = 1
    while target.exists() or target.is_symlink():
        target = folder / f"{Path(name).stem}.{counter}{Path(name).suffix}"
        counter += 1
    return target


def _valid_id(value: str) -> bool:
    return re.match(ID_PATTERN, value) is not None and ".." not in value
