"""The lane-result rules: a closed issue's history -> the task's status and result."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from ..forge.wire import ForgeIssue, ForgeRefIssue, ForgeTimelineEntry
from ..models import PullRequestRef, TaskResult, TaskStatus
from .asof import edited_after

_JSON_FENCE_RE = re.compile(r"```json[ \t]*\n(.*?)```", re.DOTALL)
_FENCE_RE = re.compile(r"```.*?```", re.DOTALL)
_HTML_COMMENT_RE = re.compile(r"<!--.*?-->", re.DOTALL)  # the controller's markers
SUMMARY_LIMIT = 2000


@dataclass(frozen=True)
class VerdictRules:
    """Closed issue -> task status: a verdict label wins; otherwise `merged` when a merged
    pull request's merge closed the issue, `unmerged` when none did (abandoned, merged
    after the issue was closed, or no PR at all). The summary is the lane's: a comment by
    `lane_login`, or one carrying `lane_marker`."""

    labels: Mapping[str, TaskStatus]
    merged: TaskStatus
    unmerged: TaskStatus
    lane_login: str = ""
    lane_marker: str = ""

    def lane_comment(self, timeline: list[ForgeTimelineEntry]) -> ForgeTimelineEntry | None:
        """The lane's last comment: by `lane_login` when it wrote any, else the last one
        carrying `lane_marker` (a lane that posts through another account), so a human who
        pastes the marker cannot replace the summary of a lane that comments as itself."""
        comments = [e for e in timeline if e.type == "comment"]
        login = self.lane_login.casefold()
        own = [e for e in comments if login and e.login.casefold() == login]
        marked = [e for e in comments if self.lane_marker and self.lane_marker in (e.body or "")]
        chosen = own or marked
        return chosen[-1] if chosen else None


class Reading(NamedTuple):
    """What a closed issue's timeline says."""

    status: TaskStatus
    result: TaskResult
    closed_at: datetime | None  # the last `close` entry (else the issue's closed_at)
    changed_at: datetime  # the newest change: the issue's, an entry's, a comment's edit
    settled: bool = False  # read as of the settle moment (asof.py), not as it stands


MergeCommit = Callable[[ForgeRefIssue], "str | None"]  # a pull request's merge commit


def read_result(
    issue: ForgeIssue,
    timeline: list[ForgeTimelineEntry],
    rules: VerdictRules,
    merge_commit: MergeCommit | None = None,
    moment: datetime | None = None,
) -> Reading:
    """The result of a closed issue from its history alone (README "Lane result protocol"):
    status from the first verdict label the forge lists, else from whether a merge closed
    it; summary and details from the lane's last comment; the pull request whose merge
    closed the issue, else the last one that references it to close it. `merge_commit`
    tells apart pull requests merged within the same second. `moment`: the settle moment
    the issue and timeline were cut at (asof.py), to tell a summary edited since."""
    closes = [e for e in timeline if e.type == "close"]
    close = closes[-1] if closes else None
    pull = task_pull(timeline, close, merge_commit)
    status = next((rules.labels[n] for n in issue.labels if n in rules.labels), None)
    if status is None:
        status = rules.merged if pull is not None and pull.closed_issue else rules.unmerged
    lane = rules.lane_comment(timeline)
    summary, details = _read_comment(lane.body or "" if lane else "")
    changed = max([issue.updated_at, *(e.changed_at for e in timeline)])
    edited = lane is not None and moment is not None and edited_after(lane, moment)
    result = TaskResult(
        summary=summary,
        details=details,
        pull_request=pull,
        summary_edited_after_settle=edited,
    )
    closed_at = close.created_at if close else issue.closed_at
    return Reading(status, result, closed_at, changed, settled=moment is not None)


def task_pull(
    timeline: list[ForgeTimelineEntry],
    close: ForgeTimelineEntry | None,
    merge_commit: MergeCommit | None = None,
) -> PullRequestRef | None:
    """The pull request that closed the issue with its merge (`closed_issue`), else the
    last merged one that references it with a closing keyword, else the last such one that
    is not merged (abandoned, or still open); None without any."""
    refs = [
        e.ref_issue
        for e in timeline
        if e.type == "pull_ref" and e.ref_action == "closes" and e.ref_issue is not None
    ]
    pulls = [r for r in refs if r.pull_request is not None]
    closer = _closer(pulls, close, merge_commit)
    if closer is not None:
        return _pull_ref(closer, closed_issue=True)
    if not pulls:
        return None
    merged = [r for r in pulls if r.pull_request is not None and r.pull_request.merged]
    return _pull_ref((merged or pulls)[-1], closed_issue=False)


def _closer(
    pulls: list[ForgeRefIssue], close: ForgeTimelineEntry | None, merge_commit: MergeCommit | None
) -> ForgeRefIssue | None:
    """The pull request whose merge made the issue's final `close`: the close names a
    commit (Gitea's `ChangeStatus` records the merge commit as the close's `ref_commit_sha`;
    a close by hand names none) and the pull request was merged at or before it, the latest
    such; of several merged in that second, the one whose merge commit the close names. A
    merge resolves a closing reference only while the issue is open
    (`services/pull/merge.go`), so a merge after a close by hand closed nothing."""
    if close is None or not close.ref_commit_sha:
        return None
    merged = [
        (ref, ref.pull_request.merged_at)
        for ref in pulls
        if ref.pull_request is not None
        and ref.pull_request.merged_at is not None
        and ref.pull_request.merged_at <= close.created_at
    ]
    latest = max((moment for _, moment in merged), default=None)
    last = [ref for ref, moment in merged if moment == latest]
    if len(last) > 1 and merge_commit is not None:
        named = [ref for ref in last if merge_commit(ref) == close.ref_commit_sha]
        last = named or last
    return last[-1] if last else None


def _pull_ref(ref: ForgeRefIssue, *, closed_issue: bool) -> PullRequestRef:
    pull = ref.pull_request
    assert pull is not None
    return PullRequestRef(
        number=ref.number,
        url=pull.html_url or ref.html_url,
        merged=pull.merged,
        closed_issue=closed_issue,
        repo=ref.repo or None,
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
