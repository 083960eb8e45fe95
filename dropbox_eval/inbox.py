"""The drop folder: which files are candidates, when they are ready, and where they end up.

Every dropped file ends in exactly one of `accepted/` (with `<name>.receipt.json`) or
`rejected/` (with `<name>.error.json`), beside where it was dropped. The original bytes are
moved, never rewritten.

What the inbox survives (README "File protocol" and "Uploading safely"):

- Readiness is judged on the file itself: a file is read once its identity, size, mtime and
  ctime stayed unchanged for the quiet period, measured on our own monotonic clock from when
  we first saw that state (so a file copied in with an old mtime waits like any other and is
  never skipped as "old"). The one event taken as proof is a rename into place from a
  temporary or hidden name: that file is read at once if it is still the very file that was
  moved. The last look before reading opens the file, which makes NFS/SMB clients
  revalidate cached attributes.
- Hostile entries: a symlink is refused and moved aside without following it; a FIFO,
  socket, device or directory named `*.json` is skipped without being opened for reading
  in a blocking way; a symlinked client folder or outcome folder is never entered or
  written through (all moves and writes go through directory descriptors opened with
  O_NOFOLLOW), so a client cannot make the service touch anything outside the inbox.
- Concurrency: the file is claimed with an exclusive `flock` for the whole read-accept-move
  step, so a second process (a `submit`, a mis-configured second service) cannot file the
  same drop twice; a file that changes while being read is left for a later look.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import BatchRejected, ForgeError, NotFoundError
from .fileio import json_bytes, temp_name, write_at
from .intake import EvalIntake, check_task_count, rejection_from_validation
from .models import BatchFile, is_valid_id, utcnow

log = logging.getLogger("dropbox_eval")

OUTCOME_DIRS = ("accepted", "rejected")
OUTCOME_SUFFIX = {"accepted": ".receipt.json", "rejected": ".error.json"}
NAME_MAX = 255
TEMP_SUFFIXES = (".filepart", ".part", ".tmp", ".writing", ".partial", ".crdownload")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_CHUNK = 1 << 20
CANCEL_RE = re.compile(r"^cancel-(.+)\.json$")
_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F]")
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_32_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32",
                  b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}

Signature = tuple[int, int, int, int, int]
"""What must stay unchanged for a file to be ready: dev, inode, size, mtime_ns, ctime_ns."""


def is_candidate_name(root: Path, path: Path) -> bool:
    """A `.json` file in the inbox or one client folder below it, not hidden or temporary.

    Temporary upload names (`*.filepart`, `*.part`, `*.tmp`, ...) do not end in `.json`, and
    hidden names (rsync's `.name.XXXXXX`, lftp's `.in.name`) start with a dot: both are
    ignored until renamed. The `.json` suffix is matched case-insensitively (`BATCH.JSON`).
    """
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return False
    if not parts or len(parts) > 2 or any(p.startswith(".") for p in parts):
        return False
    if len(parts) == 2 and parts[0] in OUTCOME_DIRS:
        return False
    name = parts[-1].lower()
    return name.endswith(".json") and not name.endswith(TEMP_SUFFIXES)


def candidates(root: Path) -> list[Path]:
    """Every candidate entry present now, without following symlinked folders.

    Lists the inbox and each real (non-symlink, non-hidden) client folder; never descends
    into `accepted/` or `rejected/`, so a rescan costs the size of the backlog, not history.
    """
    found: list[Path] = []
    for entry in _list_dir(root):
        if entry.name.startswith("."):
            continue
        if _is_real_dir(entry):
            if entry.name in OUTCOME_DIRS:
                continue
            for sub in _list_dir(Path(entry.path)):
                path = Path(sub.path)
                if not _is_real_dir(sub) and is_candidate_name(root, path):
                    found.append(path)
        elif is_candidate_name(root, Path(entry.path)):
            found.append(Path(entry.path))
    return sorted(found)


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
    """

    def __init__(self, quiet_period: float) -> None:
        self.quiet_period = quiet_period
        self._seen: dict[Path, _Seen | None] = {}
        self._renamed: dict[Path, Signature] = {}
        self._events: dict[Path, int] = {}  # per touch; one during a check keeps the path
        self._ignored: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def touch(self, path: Path) -> None:
        """Remember a path to check (thread-safe; called from the observer thread)."""
        with self._lock:
            self._touch(path)

    def changed(self, path: Path) -> None:
        """An event other than a rename into place: check the path, with the quiet period."""
        with self._lock:
            self._renamed.pop(path, None)
            self._touch(path)

    def renamed(self, path: Path) -> None:
        """A rename from a temporary or hidden name put `path` in place: complete at once.

        Called from the observer thread as the move event arrives; the signature seen now is
        the one the file must still have when it is read.
        """
        try:
            info = path.lstat()
        except OSError:
            info = None
        with self._lock:
            if info is not None and stat.S_ISREG(info.st_mode):
                self._renamed[path] = signature(info)
            else:
                self._renamed.pop(path, None)
            self._touch(path)

    def _touch(self, path: Path) -> None:
        self._seen.setdefault(path, None)
        self._events[path] = self._events.get(path, 0) + 1

    def pending(self) -> int:
        """How many paths are being watched for readiness."""
        with self._lock:
            return len(self._seen)

    def ready(self, now: float | None = None) -> Iterator[Path]:
        """Yield the paths that are ready, each checked again just before it is yielded.

        A yielded path is no longer tracked; vanished and non-regular paths are dropped
        (an event or the next rescan brings them back). Checking lazily means a file that a
        writer resumed while earlier files were being processed is not read half-written.
        A path touched again while it was being checked stays tracked for another look.
        """
        with self._lock:
            paths = sorted(self._seen)
        for path in paths:
            moment = time.monotonic() if now is None else now
            with self._lock:
                events = self._events.get(path)
            verdict = self._check(path, moment)
            if verdict is None:
                continue
            with self._lock:
                if self._events.get(path) == events:
                    self._seen.pop(path, None)
                    self._events.pop(path, None)
                    self._renamed.pop(path, None)
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
        log.warning("file %s: not a regular file (%s); ignored", path,
                    _kind(info.st_mode))


def _fresh_signature(path: Path) -> Signature | None:
    """Signature from an open descriptor (an open revalidates network-share attribute caches).

    None when the path vanished or is no longer a regular file. An unreadable file returns
    a signature from lstat so that the inbox reports it (and retries it later).
    """
    try:
        fd = os.open(path, _FILE_FLAGS)
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


@dataclass
class Outcome:
    """What happened to one dropped file."""

    status: str  # accepted | rejected | skipped
    path: Path | None
    document: dict[str, Any]


class _Skip(Exception):
    """The file cannot be handled now; it stays where it is (no receipt, no error file)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Inbox:
    """Turns ready files into batches via the intake, and files them away."""

    def __init__(self, root: Path, intake: EvalIntake, max_file_bytes: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.intake = intake
        self.max_file_bytes = max_file_bytes

    def scan(self) -> list[Path]:
        """Every candidate file present now (start-up and periodic rescans)."""
        return candidates(self.root)

    def client_folder(self, path: Path) -> str | None:
        """The client id fixed by a per-client folder, if the file sits in one."""
        parts = path.relative_to(self.root).parts
        return parts[0] if len(parts) == 2 else None

    def process(self, path: Path) -> Outcome:
        """Accept or reject one ready file; never raises for bad input.

        `skipped` means the file was left in place for a later look: it vanished, is not a
        regular file, is unreadable, is claimed by another process, or changed while read.
        """
        if not is_candidate_name(self.root, path):
            return Outcome("skipped", None, {"reason": "not an inbox candidate"})
        try:
            folder_fd = self._open_folder(path.parent)
        except _Skip as skip:
            return _skipped(path, skip)
        except OSError as exc:
            return _skipped(path, _Skip("folder_unavailable", f"cannot open the folder: {exc}"))
        try:
            return self._process_in(folder_fd, path)
        except _Skip as skip:
            return _skipped(path, skip)
        finally:
            os.close(folder_fd)

    # -- one file -------------------------------------------------------------------------

    def _process_in(self, folder_fd: int, path: Path) -> Outcome:
        for outcome in OUTCOME_DIRS:  # checked before any intake, created only when needed
            _check_outcome_folder(folder_fd, path, outcome)
        try:
            fd = self._open_file(folder_fd, path.name)
        except FileNotFoundError:
            raise _Skip("vanished", "the file disappeared before it was read") from None
        except BatchRejected as exc:
            return self._reject(folder_fd, path, exc, None, None)
        except OSError as exc:  # permissions, I/O errors, a share gone away
            raise _Skip("unreadable", f"cannot open the file, will retry: {exc}") from exc
        try:
            if not _claim(fd):
                raise _Skip("busy", "another process holds a lock on the file")
            if not _same_file(folder_fd, path.name, fd):
                raise _Skip("vanished", "the file was moved or replaced before it was read")
            log.info("file %s: reading", path)
            try:
                raw = self._read(fd)
            except BatchRejected as exc:
                return self._reject(folder_fd, path, exc, None, fd)
            except OSError as exc:
                raise _Skip("unreadable", f"cannot read the file, will retry: {exc}") from exc
            sha256 = hashlib.sha256(raw).hexdigest()
            try:
                if CANCEL_RE.match(path.name):
                    result, client_id = self._cancel(path)
                else:
                    batch, client_id = self._parse(path, raw)
                    result = self.intake.accept(batch, client_id, source=str(
                        path.relative_to(self.root)), sha256=sha256)
            except BatchRejected as exc:
                return self._reject(folder_fd, path, exc, sha256, fd)
            return self._accept(folder_fd, path, result, client_id, sha256, fd)
        finally:
            os.close(fd)

    def _open_folder(self, folder: Path) -> int:
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if folder == self.root:
            return root_fd
        try:
            return os.open(folder.name, _DIR_FLAGS, dir_fd=root_fd)
        except OSError as exc:
            if _is_symlink_at(root_fd, folder.name):
                raise _Skip("symlinked_folder", f"client folder {folder.name!r} is a "
                            "symbolic link; files in it are ignored") from exc
            raise
        finally:
            os.close(root_fd)

    def _outcome_folder(self, folder_fd: int, path: Path, outcome: str) -> int:
        """Open (creating it if needed) `accepted/` or `rejected/` without following links."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(outcome, 0o777, dir_fd=folder_fd)  # umask applies
        try:
            return os.open(outcome, _DIR_FLAGS, dir_fd=folder_fd)
        except OSError as exc:
            raise _unusable_outcome_folder(path, outcome, exc) from exc

    def _open_file(self, folder_fd: int, name: str) -> int:
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            raise BatchRejected("symlink", "symbolic links are refused; upload the file itself")
        if not stat.S_ISREG(info.st_mode):
            raise _Skip("not_a_file", f"not a regular file ({_kind(info.st_mode)})")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=folder_fd)
        except OSError as exc:
            if _is_symlink_at(folder_fd, name):
                raise BatchRejected("symlink", "symbolic links are refused; upload the file "
                                    "itself") from exc
            raise
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or opened.st_ino != info.st_ino:
            os.close(fd)
            raise _Skip("changed", "the file was replaced while being opened")
        return fd

    def _read(self, fd: int) -> bytes:
        before = os.fstat(fd)
        if before.st_size > self.max_file_bytes:
            raise BatchRejected("too_large", f"file is {before.st_size} bytes; the limit is "
                                f"{self.max_file_bytes}", limit=self.max_file_bytes)
        chunks: list[bytes] = []
        total = 0
        while total <= self.max_file_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, self.max_file_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > self.max_file_bytes:
            raise BatchRejected("too_large", f"file is over {self.max_file_bytes} bytes; the "
                                f"limit is {self.max_file_bytes}", limit=self.max_file_bytes)
        after = os.fstat(fd)
        if signature(after) != signature(before) or total != after.st_size:
            raise _Skip("changed", "the file changed while being read; it will be read again "
                        "once it stays unchanged")
        return b"".join(chunks)

    def _parse(self, path: Path, raw: bytes) -> tuple[BatchFile, str]:
        if not raw.strip():
            raise BatchRejected("invalid_json", "the file is empty")
        text = _decode(raw)
        document = _load_json(text)
        if not isinstance(document, dict):
            raise BatchRejected("invalid_batch", "the document must be a JSON object",
                                field="(document)")
        if _SURROGATE_ESCAPE_RE.search(text):
            _refuse_lone_surrogates(document)
        tasks = document.get("tasks")
        if isinstance(tasks, list):  # before pydantic parses 10,000+ tasks for nothing
            check_task_count(len(tasks), self.intake.settings.max_tasks)
        try:
            batch = BatchFile.model_validate(document)
        except ValidationError as exc:
            raise rejection_from_validation(exc) from exc
        folder_client = self.client_folder(path)
        client_id = folder_client or batch.client_id
        if client_id is None:
            raise BatchRejected("missing_client_id", "client_id is required for files dropped "
                                "at the top of the inbox", field="client_id")
        if folder_client is not None and not is_valid_id(folder_client):
            raise BatchRejected("invalid_batch", f"folder name {folder_client!r} is not a "
                                "valid client id", field="client_id")
        return batch, client_id

    def _cancel(self, path: Path) -> tuple[dict[str, Any], str]:
        """`<client>/cancel-<batch_id>.json`: cancel one of that client's running batches."""
        match = CANCEL_RE.match(path.name)
        assert match is not None
        batch_id, client_id = match.group(1), self.client_folder(path)
        if client_id is None:
            raise BatchRejected("missing_client_id", "cancel files go in the client's folder, "
                                "inbox/<client_id>/cancel-<batch_id>.json")
        try:
            batch = self.intake.store.get_batch(batch_id)
        except NotFoundError:
            batch = None
        if batch is None or batch.client_id != client_id:
            raise BatchRejected("unknown_batch", f"you have no batch {batch_id!r}",
                                batch_id=batch_id)
        if batch.status != "running":
            raise BatchRejected("not_running", f"batch {batch_id} is already {batch.status}",
                                batch_id=batch_id, status=batch.status)
        status: str
        try:
            status = self.intake.cancel(batch_id).status
        except ForgeError as exc:
            log.warning("batch %s: cancel stored, the service finishes it: %s", batch_id, exc)
            status = "cancelling"
        return {"ok": True, "batch_id": batch_id, "cancel": True, "status": status}, client_id

    # -- filing away ----------------------------------------------------------------------

    def _accept(self, folder_fd: int, path: Path, result: dict[str, Any], client_id: str,
                sha256: str, fd: int) -> Outcome:
        receipt = {**result, "client_id": client_id, "sha256": sha256, "file": path.name,
                   "accepted_at": utcnow().isoformat()}
        final = self._file_away(folder_fd, path, "accepted", receipt, fd)
        if final is not None and not result.get("duplicate") and not result.get("cancel"):
            self.intake.store.update_batch(result["batch_id"], filed=True)
        log.info("file %s: accepted as batch %s%s", path, result["batch_id"],
                 " (duplicate of an earlier drop)" if result.get("duplicate") else "")
        return Outcome("accepted", final, receipt)

    def _reject(self, folder_fd: int, path: Path, error: BatchRejected,
                sha256: str | None, fd: int | None) -> Outcome:
        document = {**error.as_dict(), "file": path.name, "sha256": sha256,
                    "rejected_at": utcnow().isoformat()}
        final = self._file_away(folder_fd, path, "rejected", document, fd)
        log.warning("file %s: rejected (%s): %s", path, error.reason, error.message)
        return Outcome("rejected", final, document)

    def _file_away(self, folder_fd: int, path: Path, outcome: str, document: dict[str, Any],
                   fd: int | None) -> Path | None:
        """Write the receipt/error file, then move the drop beside it (receipt first, so a
        client that sees its file moved also sees why). Only the file that was read (`fd`)
        is moved: a new upload that took its name meanwhile stays in the inbox."""
        suffix = OUTCOME_SUFFIX[outcome]
        out_fd = self._outcome_folder(folder_fd, path, outcome)
        try:
            target = _choose_target(out_fd, path.name, suffix, document)
            if target != path.name:
                document["filed_as"] = target
            write_at(out_fd, f"{target}{suffix}", json_bytes(document))
            if not _move(fd, folder_fd, path.name, out_fd, target):
                log.warning("file %s: vanished while being filed as %s", path, outcome)
                if outcome == "rejected":
                    with contextlib.suppress(OSError):
                        os.unlink(f"{target}{suffix}", dir_fd=out_fd)
                return None
            os.fsync(out_fd)
            os.fsync(folder_fd)
        finally:
            os.close(out_fd)
        return path.parent / outcome / target


# -- helpers ------------------------------------------------------------------------------

def _skipped(path: Path, skip: _Skip) -> Outcome:
    level = logging.INFO if skip.reason in ("vanished", "changed", "busy") else logging.WARNING
    log.log(level, "file %s: left in place (%s): %s", path, skip.reason, skip.message)
    return Outcome("skipped", None, {"reason": skip.reason, "message": skip.message})


def _check_outcome_folder(folder_fd: int, path: Path, outcome: str) -> None:
    try:
        info = os.stat(outcome, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise _unusable_outcome_folder(path, outcome, _kind(info.st_mode))


def _unusable_outcome_folder(path: Path, outcome: str, why: object) -> _Skip:
    return _Skip("outcome_folder_unusable", f"{path.parent / outcome} is not a plain folder "
                 f"({why}); nothing is filed through it, the file stays where it is")


def _decode(raw: bytes) -> str:
    for bom, encoding in _UTF16_32_BOMS.items():
        if raw.startswith(bom):
            raise BatchRejected("invalid_encoding", f"the file is {encoding} (it starts with a "
                                f"{encoding} byte-order mark); save it as UTF-8")
    if b"\x00" in raw[:4]:  # JSON text cannot start with NUL; UTF-16/32 without a BOM does
        raise BatchRejected("invalid_encoding", "the file looks like UTF-16 or UTF-32 (NUL "
                            "bytes between the first characters); save it as UTF-8")
    body = raw.removeprefix(_UTF8_BOM)  # RFC 8259 lets parsers ignore a UTF-8 BOM: we do
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        position = len(raw) - len(body) + exc.start
        raise BatchRejected("invalid_encoding", f"the file is not UTF-8 (byte {position} is "
                            f"0x{raw[position]:02x}); save it as UTF-8", byte=position
                            ) from exc


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError as exc:
        raise BatchRejected("invalid_json", "JSON is nested too deeply") from exc
    except json.JSONDecodeError as exc:
        ended_early = exc.pos >= len(text.rstrip())
        hint = " (the file ends early: an interrupted upload?)" if ended_early else ""
        raise BatchRejected("invalid_json", f"not valid JSON: {exc.msg} at line {exc.lineno} "
                            f"column {exc.colno}{hint}", line=exc.lineno, column=exc.colno
                            ) from exc
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise BatchRejected("invalid_json", f"not valid JSON: {exc}") from exc


def _no_constant(name: str) -> Any:
    raise BatchRejected("invalid_json", f"{name} is not a JSON number (RFC 8259)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise BatchRejected("invalid_json", f"duplicate key {key!r} in one object "
                                    "(JSON readers disagree on which value wins)", field=key)
            seen.add(key)
    return document


def _refuse_lone_surrogates(document: Any) -> None:
    """`"\\ud800"` is valid JSON syntax but not text; refuse it before it reaches the forge."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BatchRejected("invalid_encoding", "a string contains an unpaired UTF-16 "
                                    "surrogate escape (\\ud800-\\udfff); every string must be "
                                    "valid Unicode") from exc


def _claim(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # the filesystem has no locks (some shares): proceed unclaimed
    return True


def _same_file(folder_fd: int, name: str, fd: int) -> bool:
    try:
        now = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def _is_symlink_at(folder_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _exists_at(folder_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def outcome_name(name: str, suffix: str, counter: int = 0) -> str:
    """The name a drop is filed under: `name`, or `stem.N.ext` for the Nth clash.

    Shortened when the receipt or error file's temporary name would pass the 255-byte limit
    of file names: the stem is cut (at a character boundary) and `~` plus 8 hex digits of
    the original name's sha256 keep different long names apart. Every legal name fits.
    """
    stem, ext = os.path.splitext(name)
    tag = f".{counter}" if counter else ""
    candidate = f"{stem}{tag}{ext}"
    budget = NAME_MAX - len(temp_name(suffix).encode()) - 1  # `.{target}{suffix}.tmp`
    if len(candidate.encode()) <= budget:
        return candidate
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    keep = budget - len(f"~{digest}{tag}{ext}".encode())
    short = stem.encode("utf-8", "surrogateescape")[:keep].decode("utf-8", "ignore")
    return f"{short}~{digest}{tag}{ext}"


def _choose_target(out_fd: int, name: str, suffix: str, document: dict[str, Any]) -> str:
    """The first free outcome name; or the name whose receipt/error file an interrupted
    filing of this very drop already wrote (same bytes, same batch), so that after a crash
    the file and its receipt end up side by side, once."""
    counter = 0
    while True:
        target = outcome_name(name, suffix, counter)
        if not _exists_at(out_fd, target):
            earlier = _read_small_json(out_fd, f"{target}{suffix}")
            if earlier is _ABSENT or _same_filing(earlier, document):
                return target
        counter += 1


def _same_filing(earlier: Any, document: dict[str, Any]) -> bool:
    return (isinstance(earlier, dict) and earlier.get("sha256") == document.get("sha256")
            and earlier.get("batch_id") == document.get("batch_id"))


_ABSENT = object()


def _read_small_json(folder_fd: int, name: str) -> Any:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=folder_fd)
    except FileNotFoundError:
        return _ABSENT
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            return json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None


def _move(fd: int | None, folder_fd: int, name: str, out_fd: int, target: str) -> bool:
    """Move the drop into the outcome folder; False only when a file that was never opened
    (a symlink) vanished meanwhile.

    With the file open (`fd`), the very inode that was read is linked into place through
    /proc, and the inbox name is removed only while it still names that inode; a new upload
    that took the name stays for the next look. A drop that was replaced or deleted while
    it was being taken in is filed from the open descriptor, so its bytes are kept all the
    same. Without /proc or hard links (some shares), a rename after the same check.
    """
    if fd is None:
        try:
            os.rename(name, target, src_dir_fd=folder_fd, dst_dir_fd=out_fd)
        except FileNotFoundError:
            return False
        return True
    if os.fstat(fd).st_nlink == 0:
        write_at(out_fd, target, _read_all(fd))
        return True
    try:
        os.link(f"/proc/self/fd/{fd}", target, dst_dir_fd=out_fd, follow_symlinks=True)
    except OSError:  # no /proc, no hard links, protected_hardlinks
        if not _same_file(folder_fd, name, fd):
            write_at(out_fd, target, _read_all(fd))
            return True
        os.rename(name, target, src_dir_fd=folder_fd, dst_dir_fd=out_fd)
        return True
    if _same_file(folder_fd, name, fd):
        os.unlink(name, dir_fd=folder_fd)
    return True


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, _READ_CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _list_dir(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        log.warning("inbox: cannot list %s: %s", folder, exc)
        return []


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _kind(mode: int) -> str:
    kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
             stat.S_IFBLK: "a device", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a link"}
    return kinds.get(stat.S_IFMT(mode), "not a regular file")



