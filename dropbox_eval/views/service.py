"""The view of the service: whether a `run` holds the state folder, since when, its last
poll and error, what its last state check could not repair, and whether intake is paused
(`paused`, `paused_since`, `paused_by`: pause.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..intake.pause import Pause
from ..store.servicestate import read_status
from ..util.timestamps import restamped, rfc3339

if TYPE_CHECKING:
    from ..store.flags import Flags

SERVICE_TIMES = ("started_at", "stopped_at", "last_poll_at", "state_checked_at")
KEPT_WHEN_STOPPED = ("stopped_at", "last_error", "state_problems", "workers")


def service_view(state_dir: Path, flags: Flags | None = None) -> dict[str, Any]:
    """The running service's status record; for a stopped one only what still means
    something (when it stopped, its last error and state problems, never the old pid; its
    workers only when one `failed`: the one that stopped it, until a new start)."""
    record = read_status(state_dir) if (state_dir / "service.lock").exists() else {}
    if not record.get("running"):
        old = _stopped_record(state_dir)
        record = {"running": False} | {k: old[k] for k in KEPT_WHEN_STOPPED if old.get(k)}
        if not failed_workers(record):
            record.pop("workers", None)
    for name in SERVICE_TIMES:
        if name in record:
            record[name] = rfc3339(record[name])
    if "last_error" in record:  # written by an older version with microseconds, +00:00
        record["last_error"] = restamped(record["last_error"])
    for worker in (record.get("workers") or {}).values():
        if isinstance(worker, dict):
            worker["since"] = rfc3339(worker.get("since"))
            worker["last_error"] = restamped(worker.get("last_error"))
    return record | Pause(state_dir, flags=flags).view()


def failed_workers(record: dict[str, Any]) -> list[str]:
    """The workers of a status record that gave up (`failed`: they stop the service)."""
    workers = record.get("workers")
    if not isinstance(workers, dict):
        return []
    return sorted(
        name
        for name, worker in workers.items()
        if isinstance(worker, dict) and worker.get("state") == "failed"
    )


def _stopped_record(state_dir: Path) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads((state_dir / "service.json").read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return found
