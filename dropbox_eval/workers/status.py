"""StatusFile: what the running service says of itself in `<state>/service.json` (read by
`status`, `check` and `/readyz`), and the failed steps its parts report."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import ForgeError, StorageUnavailable
from ..util import timestamps
from ..util.fileio import write_json

if TYPE_CHECKING:
    from pathlib import Path

    from ..ops.statecheck import StateCheck

log = logging.getLogger("dropbox_eval")


def now_text() -> str:
    """The instant the status file records, in the one format (timestamps.py)."""
    return timestamps.now()


class StatusFile:
    """The service's status, kept in memory and written through to its file; a file that
    cannot be written is logged, never fatal (a full disk must not stop the service)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.status: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.forge_failures = 0  # forge errors reported so far (`run --once` exits 1 on any)
        self.storage_failures = 0  # steps storage refused (likewise)
        self.first_storage_failure = ""
        self.unwritten = ""  # why the status file was last not written (likewise)

    def set(self, **fields: Any) -> None:
        """Record `fields` and write the file."""
        with self._lock:
            self.status.update(fields)
            try:
                write_json(self.path, self.status)
            except OSError as exc:
                log.error("status file not written: %s", exc)  # the error names the file
                self.unwritten = str(exc)

    def report(self, what: str, error: Exception) -> None:
        """A part's failed step: counted, and the status's `last_error`."""
        with self._lock:
            if isinstance(error, ForgeError):
                self.forge_failures += 1
            elif isinstance(error, StorageUnavailable):
                self.storage_failures += 1
                self.first_storage_failure = self.first_storage_failure or f"{what}: {error}"
        self.set(last_error=f"{now_text()} {what}: {error}")

    def snapshot(self) -> dict[str, Any]:
        """The status as last recorded."""
        with self._lock:
            return dict(self.status)

    def check_state(self, statecheck: StateCheck) -> None:
        """The state check with repairs (at start, before any worker; and on every full
        reconciliation): what it cannot repair stays in the status for `status` and
        `/readyz` until a later check finds it gone."""
        findings = statecheck.run(repair=True)
        left = [f.as_dict() for f in findings if not f.repairable]
        self.set(
            state_checked_at=now_text(),
            state_repaired=sum(1 for f in findings if f.repaired),
            state_problems=left,
        )

    def once_failed(self) -> str | None:
        """What failed in a `run --once` pass, in one phrase, or None."""
        failed = []
        if self.forge_failures:
            failed.append(
                f"{self.forge_failures} forge visit(s) failed in this pass (see the warnings above)"
            )
        if self.storage_failures:
            failed.append(
                f"{self.storage_failures} step(s) of this pass failed on storage, first: "
                f"{self.first_storage_failure}"
            )
        elif self.unwritten:
            failed.append(f"status file not written: {self.unwritten}")
        return "; ".join(failed) or None
