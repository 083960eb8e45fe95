"""The report document: what a finished batch's client receives (outbox, callback, API).

Its one serialisation (`canonical`) is JSON with sorted keys and an indent of 2, as
`json.dumps(report, indent=2, sort_keys=True)` writes it: the same report always gives the
same bytes. A finished batch's report is built once, line by line from its tasks
(`report_document`), without a dict per task held for the whole batch.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..models import BatchRecord, BatchStatus, TaskRecord, TaskResult, TaskStatus
from ..util.canonicaljson import canonical
from ..util.timestamps import rfc3339


class ReportResult(TaskResult):
    """One task line of a report: the task, its status and issue, and what the lane said
    (TaskResult's fields)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    status: TaskStatus
    issue_url: str | None


class Report(BaseModel):
    """The document written to `outbox/<batch_id>.json` or POSTed to the callback."""

    model_config = ConfigDict(extra="forbid")

    batch_id: str
    client_id: str
    batch_ref: str | None
    status: BatchStatus
    counts: dict[str, int]
    results: list[ReportResult]
    created_at: datetime
    completed_at: datetime | None
    charged: int | None = None
    failure: str | None = None
    retry_of: str | None = None  # only present in a retry's report
    metadata: dict[str, str] | None = None  # only present when the batch has some


_NO_RESULT = TaskResult()
_RESULT_FIELDS = tuple(TaskResult.model_fields)
LINE_ORDER = ("task_id", "status", "summary", "issue_url") + tuple(
    name for name in _RESULT_FIELDS if name != "summary"
)  # a task line's keys as clients read them: the task first
_CHUNK = 1000  # task lines written by one call of the JSON writer
_RESULTS_KEY = b'\n  "results": []'  # the header's empty results, where the lines go


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
        metadata=batch.metadata,
        results=[],  # built below, a plain line per task: no model per task
    )
    data: dict[str, Any] = report.model_dump(mode="json")
    for name in ("retry_of", "metadata"):  # only a retry's report names what it retries;
        if data[name] is None:  # metadata only when the batch has some
            del data[name]
    for name in ("created_at", "completed_at"):  # the one format a client sees
        data[name] = rfc3339(data[name])
    data["results"] = [task_line(task) for task in tasks]
    return data


def task_line(task: TaskRecord) -> dict[str, Any]:
    """A task's line as clients read it: the task first, then what the lane said (every
    field of TaskResult: ReportResult's fields, without a model per line)."""
    result = task.result or _NO_RESULT
    given: dict[str, Any] = {
        "task_id": task.task_id,
        "status": str(task.status),
        "issue_url": task.issue_url,
    }
    for name in _RESULT_FIELDS:  # no model_dump per task: most fields are plain values
        value = getattr(result, name)
        given[name] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    line = {key: given[key] for key in LINE_ORDER}
    if not line["summary_edited_after_settle"]:  # said only when it is so
        del line["summary_edited_after_settle"]
    if line["pull_request"] is not None:
        line["pull_request"]["merged_at"] = rfc3339(line["pull_request"]["merged_at"])
    return line


class ReportPieces:
    """A finished batch's report, `report_document`'s bytes in pieces made as they are
    taken (again at each iteration): written to a file, it is never whole in memory, only
    one piece of `_CHUNK` task lines at a time. `bytes()` of it is the whole report."""

    def __init__(self, batch: BatchRecord, tasks: Iterable[TaskRecord]) -> None:
        self.batch = batch
        self.tasks = tasks if isinstance(tasks, list) else list(tasks)

    def __iter__(self) -> Iterator[bytes]:
        tasks = self.tasks
        head = build_report(self.batch, [])
        head["counts"] = status_counts(tasks)
        raw = canonical(head)
        if not tasks:
            yield raw
            return
        before, _, after = raw.partition(_RESULTS_KEY)  # a key: its quotes are not escaped
        yield before + b'\n  "results": ['
        for start in range(0, len(tasks), _CHUNK):
            if start:
                yield b","
            yield _lines_of([task_line(task) for task in tasks[start : start + _CHUNK]])
        yield b"\n  ]" + after

    def __bytes__(self) -> bytes:
        out = io.BytesIO()  # its value is handed over, not copied: the report is held once
        for piece in self:
            out.write(piece)
        return out.getvalue()


def report_document(batch: BatchRecord, tasks: Iterable[TaskRecord]) -> bytes:
    """The report of a finished batch as `canonical(build_report(batch, tasks))` writes it,
    built one task line at a time: nothing per task is kept but its bytes."""
    return bytes(ReportPieces(batch, tasks))


def _lines_of(lines: list[dict[str, Any]]) -> bytes:
    """Task lines as the report's `results` holds them, without its brackets: written
    alone, the list has them one level less deep, and `[` and `]` around them."""
    return canonical(lines)[1:-3].replace(b"\n", b"\n  ")  # `[`, then the lines, `\n]\n`


def in_client_order(document: bytes) -> dict[str, Any]:
    """A canonical report parsed, its keys in the order clients read them (the report's
    fields as `Report` lists them; each line's task first), as `build_report` made it."""
    report: dict[str, Any] = json.loads(document)
    report = {name: report[name] for name in Report.model_fields if name in report} | report
    results = report["results"]
    for place, line in enumerate(results):  # one line at a time: the old one goes at once
        results[place] = {key: line[key] for key in LINE_ORDER if key in line} | line
    return report


def report_batch_id(document: bytes) -> str:
    """The batch id of a canonical report: its first key (`batch_id` sorts first)."""
    start = document.index(b"\n") + 1  # after the opening brace's line
    first = document[start : document.index(b"\n", start)]
    key, _, value = first.strip().rstrip(b",").partition(b": ")
    if key != b'"batch_id"':
        raise ValueError("not a canonical report")
    batch_id: str = json.loads(value)
    return batch_id
