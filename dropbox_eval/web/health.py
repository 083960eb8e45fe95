"""Health: `/healthz` (the process answers) and `/readyz` (it can do its work).

Ready means: the store is readable, the forge answers within its timeout, the inbox is
watched (a service holds the state folder and the inbox folder is there), and every
worker of the service is up (none restarting after a failure). Each check says why it
failed, in words an operator can act on. Answers are kept for a few seconds so a page
refreshing every few seconds does not probe the forge on every view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DropboxEvalError, storage_error
from ..store.servicestate import WORKER_DOWN, read_status
from ..util import storage

if TYPE_CHECKING:
    from ..config import Settings
    from ..forge.client import GiteaClient
    from ..store import Store
    from ..store.nodes import Node

CACHE_SECONDS = 5.0


@dataclass
class Readiness:
    """The outcome of every check: `checks[name]` is "ok" or the reason it failed."""

    checks: dict[str, str] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # on a shared database

    @property
    def ready(self) -> bool:
        """Every check passed."""
        return all(value == "ok" for value in self.checks.values())


class Health:
    """Runs the readiness checks of one service's state and forge."""

    def __init__(
        self,
        store: Store,
        gitea: GiteaClient | None,
        settings: Settings,
        service_status: Callable[[], dict[str, Any] | None],
        node: Node | None = None,
    ) -> None:
        """`settings`: the state folder, inbox and outbox; `service_status()`: the running
        service's status (service.json's record, its `workers` as they are now), or None
        when no service holds the state folder; `node`: this node, whose view of every
        node sharing the store the answer lists (a peer's loss is shown, not a failure
        of this one: its work is taken over)."""
        self.node = node
        self.store = store
        self.gitea = gitea
        self.settings = settings
        self.service_status = service_status
        self._lock = threading.Lock()
        self._cached: tuple[float, Readiness] | None = None

    def readiness(self) -> Readiness:
        """The checks, at most CACHE_SECONDS old."""
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < CACHE_SECONDS:
                return self._cached[1]
            checks: dict[str, str] = {}
            for names, check in (
                (("store",), self._store),
                (("state",), self._state),
                (("forge",), self._forge),
                (("inbox", "workers"), self._service),
                (("storage",), self._storage),
            ):
                checks |= _guarded(names, check)
            result = Readiness(checks, self._nodes())
            self._cached = (time.monotonic(), result)
            return result

    def _nodes(self) -> list[dict[str, Any]]:
        if self.node is None:
            return []
        try:
            return [row.as_dict() for row in self.node.nodes()]
        except DropboxEvalError:  # the store check says why
            return []

    def _store(self) -> str:
        try:
            self.store.list_batches(live_only=True)
        except (DropboxEvalError, OSError) as exc:
            return f"state unreadable: {exc}"
        return "ok"

    def _state(self) -> str:
        """What the service's last state check could not repair (statecheck.py)."""
        problems = read_status(self.settings.state_path).get("state_problems") or []
        if not problems:
            return "ok"
        first = problems[0]
        return (
            f"{len(problems)} state problem(s) the service cannot repair, first: "
            f"{first['subject']}: {first['problem']} (see `dropbox-eval check`)"
        )

    def _storage(self) -> str:
        """A full, read-only or refused state folder, inbox or outbox (storage.py), e.g.
        `state folder /srv/state: no space left on device (ENOSPC)`; each one found."""
        found = storage.problems(self.settings, write=True)
        return "; ".join(str(problem) for problem in found) or "ok"

    def _forge(self) -> str:
        if self.gitea is None:
            return "no forge configured (SAAS_EVAL_GITEA_URL, SAAS_EVAL_GITEA_TOKEN)"
        try:
            self.gitea.version()
        except DropboxEvalError as exc:
            return f"forge unreachable: {exc}"
        return "ok"

    def _service(self) -> dict[str, str]:
        """`inbox`: watched, or why not (no service; the folder missing); `workers`: every
        worker up, or which are down (workers/supervisor.py)."""
        status = self.service_status()
        if status is None:
            return {"inbox": "no service is watching the inbox", "workers": "no service runs"}
        workers: dict[str, dict[str, Any]] = status.get("workers") or {}
        inbox_worker = workers.get("inbox-worker", {})
        waiting = inbox_worker.get("detail")
        if waiting is None and inbox_worker.get("state") in WORKER_DOWN:
            waiting = f"not watched: inbox-worker {inbox_worker['state']}"
        down = [
            f"{name} {state['state']} (restarts {state['restarts']}, last error: "
            f"{state['last_error']})"
            for name, state in sorted(workers.items())
            if state["state"] in WORKER_DOWN
        ]
        return {"inbox": waiting or "ok", "workers": "; ".join(down) or "ok"}


def _guarded(names: tuple[str, ...], check: Callable[[], str | dict[str, str]]) -> dict[str, str]:
    """`{name: outcome}` of one check (`_service` answers two), whatever it meets: an
    error is the check's value, never an exception escaping readiness."""
    try:
        outcome = check()
    except OSError as exc:  # a full, read-only or refused folder: named with its cause
        why = str(storage_error(exc) or exc)
    except DropboxEvalError as exc:
        why = str(exc)
    else:
        return outcome if isinstance(outcome, dict) else {names[0]: outcome}
    return {name: f"check failed: {why}" for name in names}
