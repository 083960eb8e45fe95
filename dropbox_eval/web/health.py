"""Health: `/healthz` (the process answers) and `/readyz` (it can do its work).

Ready means: the store is readable, the forge answers within its timeout, and the inbox is
watched (a service holds the state folder). Each check says why it failed, in words an
operator can act on. Answers are kept for a few seconds so a page refreshing every few
seconds does not probe the forge on every view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import DropboxEvalError
from ..servicestate import read_status

if TYPE_CHECKING:
    from ..app import App

CACHE_SECONDS = 5.0


@dataclass
class Readiness:
    """The outcome of every check: `checks[name]` is "ok" or the reason it failed."""

    checks: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """Every check passed."""
        return all(value == "ok" for value in self.checks.values())


class Health:
    """Runs the readiness checks of one wired App."""

    def __init__(self, app: App, inbox_watched: Callable[[], bool]) -> None:
        self.app = app
        self.inbox_watched = inbox_watched
        self._lock = threading.Lock()
        self._cached: tuple[float, Readiness] | None = None

    def readiness(self) -> Readiness:
        """The checks, at most CACHE_SECONDS old."""
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < CACHE_SECONDS:
                return self._cached[1]
            result = Readiness(
                {
                    "store": self._store(),
                    "state": self._state(),
                    "forge": self._forge(),
                    "inbox": self._inbox(),
                }
            )
            self._cached = (time.monotonic(), result)
            return result

    def _store(self) -> str:
        try:
            self.app.store.list_batches(live_only=True)
        except (DropboxEvalError, OSError) as exc:
            return f"state unreadable: {exc}"
        return "ok"

    def _state(self) -> str:
        """What the service's last state check could not repair (statecheck.py)."""
        problems = read_status(self.app.settings.state_path).get("state_problems") or []
        if not problems:
            return "ok"
        first = problems[0]
        return (
            f"{len(problems)} state problem(s) the service cannot repair, first: "
            f"{first['subject']}: {first['problem']} (see `dropbox-eval check`)"
        )

    def _forge(self) -> str:
        if self.app.gitea is None:
            return "no forge configured (SAAS_EVAL_GITEA_URL, SAAS_EVAL_GITEA_TOKEN)"
        try:
            self.app.gitea.version()
        except DropboxEvalError as exc:
            return f"forge unreachable: {exc}"
        return "ok"

    def _inbox(self) -> str:
        return "ok" if self.inbox_watched() else "no service is watching the inbox"
