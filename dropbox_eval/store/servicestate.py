"""Whether a service holds a state folder, and what its status file says: what `status`,
`/readyz` and every command that must not race a running service read (a light module:
no forge client, no web framework)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import AlreadyRunning
from ..util.locks import held_elsewhere

WORKER_DOWN = frozenset({"restarting", "failed"})  # a worker's states that need a look


def already_running(state_dir: Path) -> AlreadyRunning:
    """The error for a state folder whose lock another service holds."""
    return AlreadyRunning(
        f"another dropbox-eval run is using {state_dir} (see `dropbox-eval status`)"
    )


def read_status(state_dir: Path) -> dict[str, Any]:
    """What `dropbox-eval status` shows: whether a service holds the lock, and its record."""
    path = state_dir / "service.json"
    try:
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    record["running"] = held_elsewhere(FileLock(str(state_dir / "service.lock")))
    return record


def service_running(state_dir: Path) -> bool:
    """Whether a service holds the state folder's lock (creates no file when none ran)."""
    return running_status(state_dir) is not None


def running_status(state_dir: Path) -> dict[str, Any] | None:
    """The running service's status record, or None when no service holds the folder."""
    if not (state_dir / "service.lock").exists():
        return None
    status = read_status(state_dir)
    return status if status["running"] else None
