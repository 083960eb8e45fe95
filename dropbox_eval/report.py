"""The lane result protocol (issue -> task result) and the report document."""

from __future__ import annotations

import json
import re
from typing import Any

from .forge import ForgeComment, ForgeIssue
from .models import BatchRecord, Report, ReportResult, TaskRecord, TaskResult, TaskStatus

_JSON_FENCE_RE = re.compile(r"```json[ \t]*\n(.*?)```", re.DOTALL)
_FENCE_RE = re.compile(r"```.*?```", re.DOTALL)
SUMMARY_LIMIT = 2000


def read_result(
    issue: ForgeIssue, comments: list[ForgeComment], label_results: dict[str, str]
) -> tuple[TaskStatus, TaskResult]:
    """Status from the labels, summary and details from the final comment."""
    status = TaskStatus(
        next((label_results[n] for n in issue.labels if n in label_results), TaskStatus.CLOSED)
    )
    final = comments[-1].body if comments else ""
    details: Any = None
    fenced = _JSON_FENCE_RE.search(final)
    if fenced:
        try:
            details = json.loads(fenced.group(1))
        except ValueError:
            details = {"unparsed": fenced.group(1).strip()}
    prose = _FENCE_RE.sub("", final).strip()
    summary = prose.split("\n\n", 1)[0].strip()[:SUMMARY_LIMIT]
    return status, TaskResult(summary=summary, details=details)


def status_counts(tasks: list[TaskRecord], *, every_status: bool = False) -> dict[str, int]:
    """`total`, `passed`, `failed` and each other status that occurs (or every status)."""
    counts: dict[str, int] = {"total": len(tasks), "passed": 0, "failed": 0}
    if every_status:
        counts.update({str(status): 0 for status in TaskStatus})
    for task in tasks:
        counts[str(task.status)] = counts.get(str(task.status), 0) + 1
    return counts


def build_report(batch: BatchRecord, tasks: list[TaskRecord]) -> dict[str, Any]:
    """The report document for a finished batch (JSON-ready)."""
    report = Report(
        batch_id=batch.batch_id,
        client_id=batch.client_id,
        batch_ref=batch.batch_ref,
        status=batch.status,
        counts=status_counts(tasks),
        created_at=batch.created_at,
        completed_at=batch.completed_at,
        charged=batch.charged,
        failure=batch.failure,
        results=[
            ReportResult(
                task_id=t.task_id,
                status=t.status,
                issue_url=t.issue_url,
                summary=t.result.summary if t.result else "",
                details=t.result.details if t.result else None,
            )
            for t in tasks
        ],
    )
    data: dict[str, Any] = report.model_dump(mode="json")
    return data
