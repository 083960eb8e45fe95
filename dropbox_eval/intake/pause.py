"""The pause: `dropbox-eval pause` holds intake and forge writes until `resume`.

One file, `state/paused.json` (`{"since": ..., "by": ...}`), written atomically with the
project's one writer (fileio.py), so a pause survives a restart and every process sharing
the state folder (the service, `submit`, `cancel`, `retry`, `serve`) sees it. On a
database that several nodes share, the pause is the store's `pause` flag instead
(store/flags.py), so pausing one node pauses them all. While it
exists: files wait in the inbox (no receipt, no error file), no issue is created, commented,
labelled or closed (cancels are stored and deadlines wait), and a forge visit that fails is
not counted toward a batch's `SAAS_EVAL_MAX_ATTEMPTS`; polling and report delivery go on.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StoreError, storage_errors
from ..util.fileio import write_json
from ..util.timestamps import now

if TYPE_CHECKING:
    from ..store.flags import Flags

FILE = "paused.json"
FLAG = "pause"


class Pause:
    """The pause file of one state folder; reading it costs one small read."""

    def __init__(
        self,
        state_dir: Path,
        on_resume: Callable[[], None] | None = None,
        flags: Flags | None = None,
    ) -> None:
        """`on_resume` is called when this process resumes (the service's workers wake
        up); another process's resume is seen by the workers at their next look. `flags`:
        the store's shared flags, which then hold the pause (`Store.flags()`)."""
        self.flags = flags
        self.path = state_dir / FILE
        self.on_resume = on_resume
        self._lock = threading.Lock()
        self._flag: tuple[dict[str, Any] | None] | None = None  # the flag as last read

    def since(self) -> str | None:
        """When intake was paused (RFC 3339), or None while it runs."""
        record = self.record()
        if record is None:
            return None
        return str(record.get("since") or "unknown")

    def record(self) -> dict[str, Any] | None:
        """The pause file's content (`since`, `by`), or None when not paused. A file that
        cannot be parsed still pauses (it was written to pause): `since` is then unknown.
        A flag the database cannot give (it restarts) is as last read, if it was: the
        service's loop and its workers, which look every second, go on as they were, and
        the parts that need the database wait for it and say so."""
        if self.flags is not None:
            try:
                self._flag = (self.flags.get(FLAG),)
            except StoreError:
                if self._flag is None:
                    raise
            return self._flag[0]
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a folder, another user's 0600 file: still a pause, not a crash
            return {"since": f"unknown (unreadable pause file: {exc.strerror or exc})"}
        with contextlib.suppress(ValueError):  # bad JSON or bad UTF-8
            found = json.loads(raw)
            if isinstance(found, dict):
                return found
        return {"since": "unknown (unreadable pause file)"}

    def pause(self, by: str) -> dict[str, Any]:
        """Pause (again: the first time is kept); returns the pause record."""
        with self._lock:
            if self.flags is not None:
                return self.flags.set_first(FLAG, {"since": now(), "by": by})
            record = self.record()
            if record is None:
                record = {"since": now(), "by": by}
                write_json(self.path, record)
            return record

    def resume(self) -> dict[str, Any] | None:
        """End the pause; returns the record that ended (None if not paused) and tells the
        listeners of this process at once (the service's workers wake up)."""
        with self._lock:
            record = self.flags.clear(FLAG) if self.flags is not None else self._remove()
        if self.on_resume is not None:
            self.on_resume()
        return record

    def _remove(self) -> dict[str, Any] | None:
        """The pause file removed; what it said."""
        record = self.record()
        try:
            with storage_errors(self.path, what="cannot remove"):
                self.path.unlink()
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # an operator's `mkdir paused.json` pauses too
            self.path.rmdir()
        return record

    def view(self) -> dict[str, Any]:
        """`{"paused": bool, "paused_since", "paused_by"}`: what `status`, `/readyz`, the
        API and the page show."""
        record = self.record()
        return {
            "paused": record is not None,
            "paused_since": record.get("since") if record else None,
            "paused_by": record.get("by") if record else None,
        }
