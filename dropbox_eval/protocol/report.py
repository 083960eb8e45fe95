"""The report document: what a finished batch's client receives (outbox, callback, API)."""

from __future__ import annotations

from typing import Any

from ..models import BatchRecord, Report, ReportResult, TaskRecord, TaskStatus
from ..util.timestamps import rfc3339


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
        retry_of=batch.retry_of,
        results=[
            ReportResult(
                task_id=t.task_id,
                status=t.status,
                issue_url=t.issue_url,
                summary=t.result.summary if t.result else "",
                details=t.result.details if t.result else None,
                pull_request=t.result.pull_request if t.result else None,
                summary_edited_after_settle=bool(t.result and t.result.summary_edited_after_settle),
            )
            for t in tasks
        ],
    )
    data: dict[str, Any] = report.model_dump(mode="json")
    if data["retry_of"] is None:  # only a retry's report names what it retries
        del data["retry_of"]
    for name in ("created_at", "completed_at"):  # the one format a client sees
        data[name] = rfc3339(data[name])
    for result in data["results"]:
        if not result["summary_edited_after_settle"]:  # said only when it is so
            del result["summary_edited_after_settle"]
        if result["pull_request"] is not None:
            result["pull_request"]["merged_at"] = rfc3339(result["pull_request"]["merged_at"])
    return data
