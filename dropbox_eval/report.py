"""The lane result protocol (issue -> task result) and the report document."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from .forge import ForgeIssue, ForgeTimelineEntry
from .models import (
    BatchRecord,
    PullRequestRef,
    Report,
    ReportResult,
    TaskRecord,
    TaskResult,
    TaskStatus,
)
from .timestamps import rfc3339

_JSON_FENCE_RE = re.compile(r"```json[ \t]*\n(.*?)```", re.DOTALL)
_FENCE_RE = re.compile(r"```.*?```", re.DOTALL)
_HTML_COMMENT_RE = re.compile(r"<!--.*?-->", re.DOTALL)  # the controller's markers
SUMMARY_LIMIT = 2000


@dataclass(frozen=True)
class VerdictRules:
    """Closed issue -> task status: a verdict label wins; otherwise `merged` when a merged
    pull request closed the issue, `unmerged` when none did (abandoned or no PR at all)."""

    labels: Mapping[str, TaskStatus]
    merged: TaskStatus
    unmerged: TaskStatus


class Reading(NamedTuple):
    """What a closed issue's timeline says."""

    status: TaskStatus
    result: TaskResult
    closed_at: datetime | None  # the last `close` entry (else the issue's closed_at)
    changed_at: datetime  # the newest entry or the issue's update, whichever is later


def read_result(
    issue: ForgeIssue, timeline: list[ForgeTimelineEntry], rules: VerdictRules
) -> Reading:
    """Status from the labels or the pull request, summary and details from the final
    comment, and the pull request that closed the issue (or was abandoned)."""
    pull = closing_pull(timeline)
    status = next((rules.labels[n] for n in issue.labels if n in rules.labels), None)
    if status is None:
        status = rules.merged if pull is not None and pull.merged else rules.unmerged
    comments = [e.body or "" for e in timeline if e.type == "comment"]
    summary, details = _read_comment(comments[-1] if comments else "")
    closes = [e.created_at for e in timeline if e.type == "close"]
    changed = max([issue.updated_at, *(e.created_at for e in timeline)])
    result = TaskResult(summary=summary, details=details, pull_request=pull)
    return Reading(status, result, closes[-1] if closes else issue.closed_at, changed)


def closing_pull(timeline: list[ForgeTimelineEntry]) -> PullRequestRef | None:
    """The last merged pull request that references the issue with a closing keyword,
    else the last such one that was not merged (an abandoned lane run); None without."""
    refs = [
        e.ref_issue
        for e in timeline
        if e.type == "pull_ref" and e.ref_action == "closes" and e.ref_issue is not None
    ]
    pulls = [(r, r.pull_request) for r in refs if r.pull_request is not None]
    if not pulls:
        return None
    ref, pull = ([p for p in pulls if p[1].merged] or pulls)[-1]
    return PullRequestRef(
        number=ref.number,
        url=pull.html_url or ref.html_url,
        merged=pull.merged,
        merged_at=pull.merged_at,
    )


def _read_comment(body: str) -> tuple[str, Any]:
    """Summary (first paragraph of the prose) and details (a ```json block) of a comment."""
    details: Any = None
    fenced = _JSON_FENCE_RE.search(body)
    if fenced:
        try:
            details = json.loads(fenced.group(1))
        except ValueError:
            details = {"unparsed": fenced.group(1).strip()}
    prose = _HTML_COMMENT_RE.sub("", _FENCE_RE.sub("", body)).strip()
    return prose.split("\n\n", 1)[0].strip()[:SUMMARY_LIMIT], details


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
                pull_request=t.result.pull_request if t.result else None,
            )
            for t in tasks
        ],
    )
    data: dict[str, Any] = report.model_dump(mode="json")
    for name in ("created_at", "completed_at"):  # the one format a client sees
        data[name] = rfc3339(data[name])
    for result in data["results"]:
        if result["pull_request"] is not None:
            result["pull_request"]["merged_at"] = rfc3339(result["pull_request"]["merged_at"])
    return data
