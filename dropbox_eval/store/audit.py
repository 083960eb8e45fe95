"""The audit log: which operator did what to what, when, and how it ended.

`state/audit.jsonl`, one JSON line per operator action (the command line, the operator page,
the operator's API routes): `at` (UTC, `Z`, to the second), `actor` (the local user for the
command line, the name typed at sign-in or `operator` on the page and the API), `key_id`
(which operator key, when one was used), `via` (`cli`, `page`, `api`), `action`, `target`
(a client or batch id, or `-`), `result` (`ok`, or the error's reason code) and `detail`.

Each line is one `write` with O_APPEND, then fsynced: lines of processes writing at once
never interleave, and a line that was answered is on disk. The file is 0600 like the other
state files that name clients, never rewritten, rotated or pruned: it grows by one line per
action a person takes. Reading the newest N lines reads from the end, whatever its length.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..util.timestamps import now

AUDIT_FILE = "audit.jsonl"
CHUNK = 64 * 1024


class AuditEntry(BaseModel):
    """One operator action as the audit log keeps it."""

    at: str
    actor: str
    via: str
    action: str
    target: str
    result: str = "ok"
    key_id: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def now(
        cls,
        action: str,
        target: str,
        *,
        actor: str,
        via: str,
        result: str = "ok",
        key_id: str | None = None,
        **detail: Any,
    ) -> AuditEntry:
        """The entry of an action taken now (a missing target is `-`; empty details go)."""
        kept = {k: v for k, v in detail.items() if v is not None}
        return cls(
            at=now(),
            actor=actor,
            via=via,
            action=action,
            target=target or "-",
            result=result,
            key_id=key_id,
            detail=kept,
        )


def local_user() -> str:
    """Who runs this command line: the login name (`uid N` where the system has none)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def record_action(
    state_dir: Path,
    action: str,
    target: str,
    *,
    actor: str,
    via: str,
    result: str = "ok",
    key_id: str | None = None,
    **detail: Any,
) -> AuditEntry | None:
    """Append one action to the state folder's audit log; None (nothing written) when the
    state folder does not exist: an action that failed before any state was made."""
    entry = AuditEntry.now(
        action, target, actor=actor, via=via, result=result, key_id=key_id, **detail
    )
    if not state_dir.is_dir():
        return None
    line = entry.model_dump_json(exclude_none=True).encode() + b"\n"
    fd = os.open(state_dir / AUDIT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)  # one write with O_APPEND: lines never interleave
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def read_actions(state_dir: Path, limit: int | None = None) -> list[AuditEntry]:
    """The newest `limit` actions (all without a limit), oldest first; a line cut short
    by a crash is skipped."""
    entries = []
    for raw in _newest_lines(state_dir / AUDIT_FILE, limit):
        with contextlib.suppress(ValueError):
            entries.append(AuditEntry.model_validate(json.loads(raw)))
    return entries


def _newest_lines(path: Path, limit: int | None) -> list[bytes]:
    try:
        file = path.open("rb")
    except FileNotFoundError:
        return []
    with file:
        position = file.seek(0, os.SEEK_END)
        data = b""
        while position > 0 and (limit is None or data.count(b"\n") <= limit):
            step = min(CHUNK, position)
            position -= step
            file.seek(position)
            data = file.read(step) + data
    lines = [line for line in data.split(b"\n") if line.strip()]
    if position > 0:
        lines = lines[1:]  # the first may start mid-line
    return lines if limit is None else lines[-limit:]


class AuditTrail:
    """The store's side of the audit log (a mixin of the engine, beside the others)."""

    state_dir: Path

    def record_action(
        self,
        action: str,
        target: str,
        *,
        actor: str,
        via: str,
        result: str = "ok",
        key_id: str | None = None,
        **detail: Any,
    ) -> None:
        """Append one operator action to the audit log (`record_action`)."""
        record_action(
            self.state_dir,
            action,
            target,
            actor=actor,
            via=via,
            result=result,
            key_id=key_id,
            **detail,
        )

    def audit_entries(self, limit: int | None = None) -> list[AuditEntry]:
        """The newest `limit` actions of the audit log, oldest first."""
        return read_actions(self.state_dir, limit)
