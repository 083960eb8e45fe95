"""The drop folder: every dropped file ends in exactly one of `accepted/` (with
`<name>.receipt.json`) or `rejected/` (with `<name>.error.json`), beside where it was
dropped. The original bytes are moved, never rewritten.

What the inbox survives (README "File protocol" and "Uploading safely"):

- Readiness is judged on the file itself (`readiness.py`); the one event taken as proof is
  a rename into place from a temporary or hidden name.
- Hostile entries: a symlink is refused and moved aside without following it; a FIFO,
  socket, device or directory named `*.json` is skipped; a symlinked client folder or
  outcome folder is never entered or written through (`fsops.py`).
- Concurrency: the file is claimed with an exclusive `flock` for the whole
  read-accept-move step, and only the file that was read is filed: a new upload that
  took its name meanwhile stays for the next look.
- A full or read-only disk (errors.StorageUnavailable): the file stays, and is not taken
  again before a wait (1 s doubling to a minute, clock.Backoff), however often it is seen.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BatchRejected, Conflict, ForgeError, NotFoundError, StorageUnavailable
from ..models import BatchFile, BatchRecord, BatchStatus
from ..protocol.batchlines import is_lines_name
from ..protocol.documents import ErrorFile, receipt_for
from ..store.nodes import SoloNode, leased
from ..util import crashpoints, timestamps
from ..util.clock import Backoff
from . import fsops
from .checks import cancel_request_of, cancel_target, name_problem, read_drop
from .filing import Skip, check_outcome_folder, file_away, shown
from .opening import open_file, open_folder, read_whole
from .readiness import ReadinessTracker
from .scan import OUTCOME_DIRS, candidates, is_candidate_name
from .sweep import StaleUploads

if TYPE_CHECKING:
    from ..ports import Accepting
    from ..store import Store
    from ..store.nodes import Node

__all__ = [
    "Inbox",
    "Outcome",
    "ReadinessTracker",
    "cancel_target",
    "candidates",
    "is_candidate_name",
    "name_problem",
    "read_drop",
]

log = logging.getLogger("dropbox_eval")


@dataclass
class Outcome:
    """What happened to one dropped file."""

    status: str  # accepted | rejected | skipped
    path: Path | None
    document: dict[str, Any]


class Inbox:
    """Turns ready files into batches via the intake, and files them away."""

    def __init__(
        self,
        root: Path,
        store: Store,
        intake: Accepting,
        cancel: Callable[[str], BatchRecord],
        *,
        max_file_bytes: int,
        max_tasks: int,
        stale_after: float,
        paused: Callable[[], str | None] = lambda: None,
        on_recorded: Callable[[str, str], object] | None = None,
        on_reject: Callable[[dict[str, Any], str | None], None] | None = None,
        on_filed: Callable[[str, float], None] | None = None,
        node: Node | None = None,
    ) -> None:
        """`intake` records batches; `cancel` cancels one (a cancel file); `stale_after`:
        seconds after which an upload never renamed into place goes. `paused`: when
        intake was paused (pause.py), or None (a paused inbox leaves every file);
        `on_recorded` is handed each new batch once its drop is filed (the service's
        opener, or, for a command alone, a visit that opens its issues before `process`
        returns); `on_reject` is told of every rejection (the operator's rejection log);
        `on_filed` of every filed drop: outcome and seconds since its last change. `node`:
        this node among those sharing the store, whose `drop` lease a file is read under
        (another node may see the same file on a shared folder); None: the only one."""
        self.root = root.resolve()
        self._root_prefix = f"{self.root}/" if str(self.root) != "/" else "/"
        self.stale_uploads = StaleUploads(self.root, stale_after)
        self.store = store
        self.intake = intake
        self.cancel = cancel
        self.max_file_bytes = max_file_bytes
        self.max_tasks = max_tasks
        self.on_reject = on_reject
        self.on_recorded = on_recorded
        self.on_filed = on_filed
        self.paused = paused
        self.storage_waits = Backoff()  # drops whose last look storage refused
        self.node = node or SoloNode("solo")

    def scan(self) -> list[Path]:
        """Every candidate file present now (start-up and periodic rescans); stale uploads
        are swept on the way, at most every few minutes (sweep.py)."""
        self.stale_uploads.sweep_if_due()
        return candidates(self.root)

    def client_folder(self, path: Path) -> str | None:
        """The client id fixed by a per-client folder, if the file sits in one."""
        # On the string: it runs for each tracked file at every look (path.relative_to
        # cost 3 ms a drop with 300 waiting); `path` is absolute and normalised, as the
        # watcher and the scan give it.
        top, separator, below = str(path).partition(self._root_prefix)
        if top or not separator:
            raise ValueError(f"{path} is not below the inbox {self.root}")
        folder, _, name = below.partition("/")
        return folder if name and "/" not in name else None

    def process(self, path: Path) -> Outcome:
        """Accept or reject one ready file; never raises for bad input.

        `skipped` means the file was left in place for a later look: it vanished, is not a
        regular file, is unreadable, is claimed by another process, or changed while read.
        """
        if not is_candidate_name(self.root, path):
            return Outcome("skipped", None, {"reason": "not an inbox candidate"})
        since = self.paused()
        if since is not None:  # no receipt, no error file: it waits for `resume`
            why = f"intake is paused since {since}; the file waits for `dropbox-eval resume`"
            return Outcome("skipped", None, {"reason": "paused", "message": why})
        if not self.storage_waits.ready(str(path)):  # said when it failed: quiet till then
            why = "storage refused the last look; the file waits before the next"
            return Outcome("skipped", None, {"reason": "storage", "message": why})
        try:
            folder_fd = open_folder(self.root, path.parent)
        except Skip as skip:
            return _skipped(path, skip)
        except OSError as exc:
            return _skipped(path, Skip("folder_unavailable", f"cannot open the folder: {exc}"))
        try:
            outcome = self._process_in(folder_fd, path)
        except Skip as skip:
            return _skipped(path, skip)
        except StorageUnavailable:
            self.storage_waits.failed(str(path))
            raise
        finally:
            os.close(folder_fd)
        self.storage_waits.succeeded(str(path))
        return outcome

    # -- one file -------------------------------------------------------------------------

    def _process_in(self, folder_fd: int, path: Path) -> Outcome:
        for outcome in OUTCOME_DIRS:  # checked before any intake, created only when needed
            check_outcome_folder(folder_fd, path, outcome)
        bad_name = name_problem(path.name)
        if bad_name is not None:  # before anything is created: it could not be reported
            error = BatchRejected("invalid_name", f"{bad_name}; rename the file and drop it again")
            return self._reject(folder_fd, path, error, None, None)
        try:
            fd = open_file(folder_fd, path.name)
        except FileNotFoundError:
            raise Skip("vanished", "the file disappeared before it was read") from None
        except BatchRejected as exc:
            return self._reject(folder_fd, path, exc, None, None)
        except OSError as exc:  # permissions, I/O errors, a share gone away
            raise Skip("unreadable", f"cannot open the file, will retry: {exc}") from exc
        try:
            if not fsops.claim(fd):
                raise Skip("busy", "another process holds a lock on the file")
            # a lock on a network share may not reach another host: the store's lease does
            with leased(self.node, "drop", str(path.relative_to(self.root))) as mine:
                if not mine:
                    raise Skip("busy", "another node is filing the file")
                return self._read_and_take(folder_fd, path, fd)
        finally:
            os.close(fd)

    def _read_and_take(self, folder_fd: int, path: Path, fd: int) -> Outcome:
        """Read the claimed file, if it is still the one at its name, and take it."""
        if not fsops.same_file(folder_fd, path.name, fd):
            raise Skip("vanished", "the file was moved or replaced before it was read")
        log.info("file %s: reading", shown(path))
        try:
            raw = read_whole(fd, self.max_file_bytes)
        except BatchRejected as exc:
            return self._reject(folder_fd, path, exc, None, fd)
        except OSError as exc:
            raise Skip("unreadable", f"cannot read the file, will retry: {exc}") from exc
        sha256 = hashlib.sha256(raw).hexdigest()
        cancel_of = cancel_request_of(path.name, raw)
        with crashpoints.operation("intake" if cancel_of is None else "cancel"):
            return self._take(folder_fd, path, raw, sha256, fd, cancel_of)

    def _take(
        self, folder_fd: int, path: Path, raw: bytes, sha256: str, fd: int, cancel_of: str | None
    ) -> Outcome:
        """Accept (or cancel batch `cancel_of`) and file away: the record with its hold,
        then the receipt and the move, then `filed` on the record. A kill after any of these
        writes is finished by the next look at the same file (its batch is found by its
        digest)."""
        try:
            if cancel_of is not None:
                result, client_id = self._cancel(path, cancel_of)
            else:
                batch, client_id = self._parse(path, raw)
                result = self.intake.accept(
                    batch,
                    client_id,
                    source=str(path.relative_to(self.root)),
                    sha256=sha256,
                    open_now=False,  # the receipt first; its issues are opened once filed
                )
        except BatchRejected as exc:
            return self._reject(folder_fd, path, exc, sha256, fd)
        return self._accept(folder_fd, path, result, client_id, sha256, fd)

    def _parse(self, path: Path, raw: bytes) -> tuple[BatchFile, str]:
        return read_drop(
            raw,
            self.client_folder(path),
            max_bytes=self.max_file_bytes,
            max_tasks=self.max_tasks,
            lines=is_lines_name(path.name),
        )

    def _cancel(self, path: Path, cancel_of: str) -> tuple[dict[str, Any], str]:
        """`<client>/cancel-<batch_id>.json`: cancel one of that client's running batches."""
        batch_id, client_id = cancel_target(cancel_of, self.client_folder(path))
        try:
            batch = self.store.get_batch(batch_id)
        except NotFoundError:
            batch = None
        if batch is None or batch.client_id != client_id:
            raise BatchRejected(
                "unknown_batch", f"you have no batch {batch_id!r}", batch_id=batch_id
            )
        if batch.status == BatchStatus.CANCELLED:  # asked twice, or read again after a kill
            return {"ok": True, "batch_id": batch_id, "cancel": True, "status": batch.status}, (
                client_id
            )
        if batch.status.is_finished:
            raise BatchRejected(
                "not_running",
                f"batch {batch_id} is already {batch.status}",
                batch_id=batch_id,
                status=batch.status,
            )
        status: str
        try:
            status = self.cancel(batch_id).status
        except (ForgeError, Conflict) as exc:
            log.warning("batch %s: cancel stored, the service finishes it: %s", batch_id, exc)
            status = "cancelling"
        return {"ok": True, "batch_id": batch_id, "cancel": True, "status": status}, client_id

    # -- filing away ----------------------------------------------------------------------

    def _accept(
        self,
        folder_fd: int,
        path: Path,
        result: dict[str, Any],
        client_id: str,
        sha256: str,
        fd: int,
    ) -> Outcome:
        receipt = receipt_for(
            {
                **result,
                "client_id": client_id,
                "sha256": sha256,
                "file": path.name,
                "accepted_at": timestamps.now(),
            }
        )
        dropped = _changed_at(fd)
        final = file_away(folder_fd, path, "accepted", receipt, fd)
        self._filed("accepted", dropped)
        if final is not None and not result.get("duplicate") and not result.get("cancel"):
            self.intake.filed(result)
            self._recorded(result["batch_id"], client_id)
        log.info(
            "file %s: accepted as batch %s%s",
            shown(path),
            result["batch_id"],
            " (duplicate of an earlier drop)" if result.get("duplicate") else "",
        )
        return Outcome("accepted", final, receipt.document())

    def _recorded(self, batch_id: str, client_id: str) -> None:
        if self.on_recorded is not None:
            self.on_recorded(batch_id, client_id)

    def _reject(
        self, folder_fd: int, path: Path, error: BatchRejected, sha256: str | None, fd: int | None
    ) -> Outcome:
        error_file = ErrorFile.model_validate(
            {
                **error.as_dict(),
                "file": path.name,
                "sha256": sha256,
                "rejected_at": timestamps.now(),
            }
        )
        dropped = _changed_at(fd)
        final = file_away(folder_fd, path, "rejected", error_file, fd)
        document = error_file.document()
        self._filed("rejected", dropped)
        log.warning("file %s: rejected (%s): %s", shown(path), error.reason, error.message)
        if self.on_reject is not None:
            try:
                self.on_reject(document, self.client_folder(path))
            except (
                OSError,
                ValueError,
            ) as exc:  # the log is for operators: never fail the drop on it
                log.error("cannot record the rejection of %s: %s", shown(path), exc)
        return Outcome("rejected", final, document)

    def _filed(self, outcome: str, dropped: float | None) -> None:
        if self.on_filed is not None and dropped is not None:
            self.on_filed(outcome, time.time() - dropped)


def _changed_at(fd: int | None) -> float | None:
    """When the drop last changed (its ctime: the rename into place or the last write),
    read before filing it away changes it."""
    return None if fd is None else os.fstat(fd).st_ctime


def _skipped(path: Path, skip: Skip) -> Outcome:
    level = logging.INFO if skip.reason in ("vanished", "changed", "busy") else logging.WARNING
    log.log(level, "file %s: left in place (%s): %s", shown(path), skip.reason, skip.message)
    return Outcome("skipped", None, {"reason": skip.reason, "message": skip.message})
