"""The issue text of a task and its marker: the fingerprint that makes creation idempotent.

Only the marker the service writes counts: the body's last line, in the exact format.
Client text is neutralised (`<!--` is shown as text), so a task cannot carry a marker of
another batch and be adopted by it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ..models import BatchRecord, TaskSpec, TaskStatus
from .client import ForgeIssue, GiteaClient

log = logging.getLogger("dropbox_eval")

MARKER_RE = re.compile(r"<!-- dropbox-eval:task batch=([A-Za-z0-9._-]+) task=([A-Za-z0-9._-]+) -->")
ADOPT_MARGIN = timedelta(hours=1)  # finding an interrupted intake's issues tolerates skew


def marker(batch_id: str, task_id: str) -> str:
    """The invisible fingerprint of one task's issue."""
    return f"<!-- dropbox-eval:task batch={batch_id} task={task_id} -->"


def neutralised(text: str) -> str:
    """Client text with HTML comments made visible (`<!--` -> `&lt;!--`), so a task cannot
    carry a marker, or hide anything from the people reading the issue."""
    return text.replace("<!--", "&lt;!--")


def issue_body(batch_id: str, task: TaskSpec) -> str:
    """Task spec + acceptance + `batch:` line + marker, which is always the last line."""
    body = neutralised(task.body.strip())
    parts = [body] if body else []
    if task.acceptance:
        parts.append(
            "## Acceptance\n" + "\n".join(f"- [ ] {neutralised(item)}" for item in task.acceptance)
        )
    parts.append(f"batch: {batch_id}\ntask: {task.task_id}")
    parts.append(marker(batch_id, task.task_id))
    return "\n\n".join(parts) + "\n"


def read_marker(body: str) -> tuple[str, str] | None:
    """(batch_id, task_id) of the marker the service wrote: the body's last line, exactly.
    A marker anywhere else is client text and does not count."""
    lines = body.rstrip().splitlines()
    match = MARKER_RE.fullmatch(lines[-1].strip()) if lines else None
    return (match.group(1), match.group(2)) if match else None


def find_marked(
    gitea: GiteaClient, batch: BatchRecord, task_ids: Iterable[str], label: str
) -> dict[str, ForgeIssue]:
    """The issues an interrupted attempt created for these tasks, by their marker."""
    wanted = set(task_ids)
    found: dict[str, ForgeIssue] = {}
    for issue in gitea.iter_issues(batch.repo, labels=label, since=batch.created_at - ADOPT_MARGIN):
        marked = read_marker(issue.body)
        if marked is not None and marked[0] == batch.batch_id and marked[1] in wanted:
            found.setdefault(marked[1], issue)
    if found:
        log.info("batch %s: found %d issues from an interrupted intake", batch.batch_id, len(found))
    return found


def opened(number: int, url: str) -> dict[str, Any]:
    """The change that records a task's issue."""
    return {"status": TaskStatus.OPEN, "issue_number": number, "issue_url": url}
