"""Helpers the test files share: a client dropping a batch file, the lane finishing a
batch's issues on the sandbox forge, a loopback port nothing listens on."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dropbox_eval.models import LedgerEntry, LedgerKind
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.fileio import write_atomically
from dropbox_eval.util.timestamps import utcnow

PASS = "eval-pass"


def drop(
    inbox: Path, name: str, content: Any, client: str | None = None, *, in_place: bool = False
) -> Path:
    """Drop `content` (bytes, text, or a document written as JSON) as `name` in `client`'s
    folder of `inbox` (the inbox itself without a client); the dropped file's path. It is
    written under a hidden name and renamed into place, as an uploader that renames does,
    or `in_place` (a plain copy, and the only way to write a name of 255 bytes)."""
    path = (inbox / client if client else inbox) / name
    data = content if isinstance(content, bytes | str) else json.dumps(content)
    if in_place:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    else:
        write_atomically(path, data)
    return path


def receipt_of(dropped: Path) -> Path:
    """Where the receipt of the file dropped at `dropped` is written once it is accepted."""
    return dropped.parent / "accepted" / f"{dropped.name}.receipt.json"


def open_issues(forge: SandboxForge, repo: str) -> list[int]:
    """The numbers of the open issues (not pull requests) of `repo` (`owner/name`), in the
    order they were opened."""
    owner, name = repo.split("/")
    return [
        issue["number"]
        for issue in forge.issues(owner, name)
        if issue["state"] == "open" and not issue.get("pull_request")
    ]


def finish_issues(
    forge: SandboxForge,
    repo: str,
    verdicts: str | Sequence[str] | Mapping[int, str] = PASS,
    *,
    comment: str | None = "ok",
    count: int | None = None,
) -> list[int]:
    """The lane finishes the open issues of `repo` (`owner/name`), the first `count` of them
    (all without one) in the order they were opened: `comment` (none when None), a verdict
    label, close. `verdicts`: one label for every issue, one per issue in order (as many
    as there are issues), or labels by issue number (the issues it leaves out pass).
    The numbers of the issues finished."""
    numbers = open_issues(forge, repo)[:count]
    if isinstance(verdicts, str):
        labels = dict.fromkeys(numbers, verdicts)
    elif isinstance(verdicts, Mapping):
        labels = {number: verdicts.get(number, PASS) for number in numbers}
    else:
        labels = dict(zip(numbers, verdicts, strict=True))
    owner, name = repo.split("/")
    for number, label in labels.items():
        forge.finish_issue(owner, name, number, comment=comment, labels=[label])
    return numbers


def closed_port() -> int:
    """A loopback TCP port that nothing listens on: bound to find a free one, then closed,
    so a connection to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fixed_report(store: Any, batch_id: str) -> dict[str, Any] | None:
    """The report the store fixed when the batch ended, parsed (None: none fixed)."""
    raw = store.get_report(batch_id)
    return None if raw is None else dict(json.loads(raw))


def ledger_entry(
    kind: LedgerKind, amount: int, held: int = 0, batch_id: str | None = None
) -> LedgerEntry:
    """A ledger entry of the client `acme` (balance_after left at 0: the store sets it)."""
    return LedgerEntry(
        client_id="acme",
        kind=kind,
        amount=amount,
        held_change=held,
        balance_after=0,
        batch_id=batch_id,
        at=utcnow(),
    )
