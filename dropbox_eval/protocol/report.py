"""The report document: what a finished batch's client receives (outbox, callback, API)."""

from __future__ import annotations

from typing import Any

from ..models import BatchRecord, Report, ReportResult, TaskRecord, TaskResult, TaskStatus
from ..util.timestamps import rfc3339

LEADING = ("task_id", "status", "summary", "issue_url")  # a task line's first keys


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
                **(t.result or TaskResult()).model_dump(),
            )
            for t in tasks
        ],
    )
    data: dict[str, Any] = report.model_dump(mode="json")
    if data["retry_of"] is None:  # only a retry's report names what it retries
        del data["retry_of"]
    for name in ("created_at", "completed_at"):  # the one format a client sees
        data[name] = rfc3339(data[name])
    data["results"] = [_task_line(result) for result in data["results"]]
    return data


def _task_line(result: dict[str, Any]) -> dict[str, Any]:
    """A task's line as clients read it: the task first, then what the lane said."""
    line = {key: result.pop(key) for key in LEADING}
    line.update(result)
    if not line["summary_edited_after_settle"]:  # said only when it is so
        del line["summary_edited_after_settle"]
    if line["pull_request"] is not None:
        line["pull_request"]["merged_at"] = rfc3339(line["pull_request"]["merged_at"])
    return line
