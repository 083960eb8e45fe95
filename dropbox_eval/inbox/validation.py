"""Checking a batch file before it is uploaded (`dropbox-eval validate`): every check the
inbox makes of a drop that needs neither the state nor the network, made by the inbox's own
functions (inbox/checks.py, batchfile.py, callbacks.py) with the same limits, so a file
gives the same reason and message here as in its error file.

Not checked, because they are not properties of the file: whether the client has an
account and enough credits (`unknown_client`, `unfunded`), whether the same bytes or
`batch_ref` made a batch already (a duplicate is accepted with `"duplicate": true`, never
rejected), which addresses a callback host resolves to (the service looks the name up from
its own network when the file is dropped; here only the URL's form and an address written
in it are judged), and whether a cancel request names a running batch of yours.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import BatchRejected
from ..protocol.batchfile import check_claims, window_of
from ..protocol.batchlines import is_lines_name
from ..protocol.callbacks import CallbackPolicy
from ..protocol.namefilter import NAMES, NameKind
from .checks import cancel_request_of, cancel_target, name_problem, read_drop
from .filing import Skip
from .opening import read_whole

_UNREAD_NAMES = {
    NameKind.TEMPORARY: "a temporary upload name: the inbox reads the file once it is renamed "
    "to *.json",
    NameKind.HIDDEN: "a hidden name: the inbox reads the file once it is renamed to *.json",
    NameKind.OTHER: "not a *.json name: the inbox never reads this file",
}


class Unread(Exception):
    """The inbox would not read the file at all (its name, or not a file)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Verdict:
    """What the inbox would make of one file: accepted (`error` None) or why not."""

    path: Path
    error: BatchRejected | None = None
    unread: str | None = None  # why the inbox would not read it at all
    client_id: str | None = None
    task_count: int = 0
    cancel_of: str | None = None  # a cancel request: the batch it names

    def problems(self) -> list[str]:
        """One line per problem, `FILE: message`: the error file's message, then each
        further field error it lists."""
        if self.unread is not None:
            return [f"{self.path}: {self.unread}"]
        if self.error is None:
            return []
        errors = self.error.details.get("errors") or []
        lines = [f"{e['field']}: {e['reason']}" for e in errors] or [self.error.message]
        return [f"{self.path}: {line}" for line in lines]

    def summary(self) -> str:
        """One line saying what was found."""
        if self.error is not None or self.unread is not None:
            return self.problems()[0]
        if self.cancel_of is not None:
            return f"{self.path}: ok, a cancel request for batch {self.cancel_of}"
        tasks = "1 task" if self.task_count == 1 else f"{self.task_count} tasks"
        return f"{self.path}: ok, {tasks} for client {self.client_id}"

    def document(self) -> dict[str, Any]:
        """The verdict under `--json`: the error document the inbox would write, or ok."""
        if self.unread is not None:
            return {"file": str(self.path), "ok": False, "reason": "unread", "message": self.unread}
        if self.error is not None:
            return {"file": str(self.path), **self.error.as_dict()}
        found: dict[str, Any] = {"file": str(self.path), "ok": True, "client_id": self.client_id}
        if self.cancel_of is not None:
            return found | {"cancel": self.cancel_of}
        return found | {"task_count": self.task_count}


def check_file(path: Path, settings: Settings, folder_client: str | None) -> Verdict:
    """The inbox's verdict on `path` dropped into `inbox/<folder_client>/` (or at the top
    of the inbox when None)."""
    try:
        return _check(path, settings, folder_client)
    except BatchRejected as error:
        return Verdict(path, error)
    except (Unread, Skip) as why:
        return Verdict(path, unread=why.message)
    except OSError as exc:
        return Verdict(path, unread=f"cannot read the file: {exc.strerror or exc}")


def _check(path: Path, settings: Settings, folder_client: str | None) -> Verdict:
    name = path.name
    bad_name = name_problem(name)
    if bad_name is not None:
        raise BatchRejected("invalid_name", f"{bad_name}; rename the file and drop it again")
    kind = NAMES.kind(name)
    if kind is not NameKind.CANDIDATE:
        raise Unread(_UNREAD_NAMES[kind])
    if folder_client is not None and not NAMES.is_client_folder(folder_client):
        raise Unread(f"files in a folder named {folder_client!r} are never read by the inbox")
    raw = _read(path, settings.max_file_bytes)  # a cancel file too: the inbox reads it first
    cancel_of = cancel_request_of(name, raw)
    if cancel_of is not None:
        batch_id, client_id = cancel_target(cancel_of, folder_client)
        return Verdict(path, client_id=client_id, cancel_of=batch_id)
    batch, client_id = read_drop(
        raw,
        folder_client,
        max_bytes=settings.max_file_bytes,
        max_tasks=settings.max_tasks,
        lines=is_lines_name(name),
    )
    check_claims(batch, client_id, settings.max_tasks)
    if batch.callback_url:
        CallbackPolicy(settings.callback_allow).check_unresolved(batch.callback_url)
    window_of(batch, settings.completion_window, settings.max_completion_window)
    return Verdict(path, client_id=client_id, task_count=len(batch.tasks))


def _read(path: Path, max_bytes: int) -> bytes:
    """The file's bytes through the inbox's reader (a link is followed: see README)."""
    if not path.is_file():
        raise Unread("not a regular file" if path.exists() else "no such file")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_whole(fd, max_bytes)
    finally:
        os.close(fd)
