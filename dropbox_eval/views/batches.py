"""The views of a batch, its tasks and a listing row (what every output shows of them)."""

from __future__ import annotations

from typing import Any

from ..models import BatchRecord, TaskRecord
from ..protocol.report import status_counts
from ..util.timestamps import rfc3339
from .progress import Progress

BATCH_TIMES = (
    "created_at",
    "deadline",
    "completed_at",
    "emitted_at",
    "last_polled_at",
    "next_attempt_at",
    "next_delivery_at",
)
ROW_TIMES = ("created_at", "completed_at", "emitted_at")
OPERATOR_ONLY = ("source", "sha256")
"""Where a drop came from on the operator's disk: left out of what a client's API key sees."""


def times(data: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """`data` with each of `fields` in the one timestamp format."""
    return data | {name: rfc3339(data.get(name)) for name in fields if name in data}


def batch_view(record: BatchRecord, tasks: list[TaskRecord] | None = None) -> dict[str, Any]:
    """One batch: its fields, progress (with settling), delivery state and, with its tasks,
    the counts of every status and each task."""
    data = record.model_dump(mode="json", exclude={"settling_tasks"})
    progress = (
        Progress.of(record.status, record.total, record.done, record.settling_tasks)
        if tasks is None
        else Progress.from_tasks(record.status, tasks)
    )
    data = times(data, BATCH_TIMES) | {
        "progress": progress.as_dict(),
        "delivery": delivery_state(record),
    }
    if tasks is not None:
        data["counts"] = status_counts(tasks, every_status=True)
        data["tasks"] = [task_view(task) for task in tasks]
    return data


def delivery_state(record: BatchRecord) -> str:
    """`waiting` (still running), `delivered`, `retrying`, `given_up` or `due`."""
    if record.emitted_at is not None:
        return "delivered"
    if not record.status.is_finished:
        return "waiting"
    if record.delivery_attempts and record.next_delivery_at is None:
        return "given_up"
    return "retrying" if record.delivery_attempts else "due"


def task_view(task: TaskRecord) -> dict[str, Any]:
    """One task: status (with `settling` while its closed issue settles), issue, result."""
    result = task.result
    pull = result.pull_request if result else None
    return {
        "task_id": task.task_id,
        "status": task.status,
        "settling": task.settling is not None and not task.status.is_finished,
        "issue_number": task.issue_number,
        "issue_url": task.issue_url,
        "summary": result.summary if result else None,
        "details": result.details if result else None,
        "pull_request": times(pull.model_dump(mode="json"), ("merged_at",)) if pull else None,
        "created_at": rfc3339(task.created_at),
        "finished_at": rfc3339(task.finished_at),
    }


def row_view(row: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """A listing row (the index's summary of a batch) with its progress."""
    return times(row, ROW_TIMES) | {"progress": progress.as_dict()}


def for_client(view: dict[str, Any]) -> dict[str, Any]:
    """A view as a client's API key sees it (no operator-only fields)."""
    return {key: value for key, value in view.items() if key not in OPERATOR_ONLY}
