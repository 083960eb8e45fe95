"""ResultReader: a listed issue -> the change it makes to its open task.

A closed issue is read once (its timeline, plus the merged pull request with `pull_details`)
and its result kept on the task as `settling`; the task finishes only once nothing about the
issue changed for `settle_seconds`, because a lane's close, label and verdict comment are
separate API calls that may arrive seconds apart and in any order. An issue is read again
only when the listing shows it changed (see `listing_key`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .config import Settings
from .errors import ForgeNotFound
from .forge import ForgeIssue, GiteaClient, UsesForge
from .models import PullRequestRef, Settling, TaskRecord, TaskResult, TaskStatus, utcnow
from .report import Reading, VerdictRules, read_result


class ResultReader(UsesForge):
    """Reads the result of an issue the lane closed, and says when it is final."""

    def __init__(self, gitea: GiteaClient | None, settings: Settings) -> None:
        self._gitea = gitea
        self.settings = settings
        self.rules = VerdictRules(
            labels={name: TaskStatus(s) for name, s in settings.label_results.items()},
            merged=TaskStatus(settings.merged_status),
            unmerged=TaskStatus(settings.unmerged_status),
        )

    def observe(self, repo: str, task: TaskRecord, issue: ForgeIssue) -> dict[str, Any] | None:
        """The change a listed issue makes to its open task: none while open (back to
        running when it was reopened before settling); once closed, its result read from
        the timeline (again only if the issue changed), final when settled."""
        known = task.settling
        if issue.state != "closed":
            return None if known is None else {"settling": None}
        if known is not None and known.seen == listing_key(issue):
            return self.settled_change(known)
        return self.finish(repo, issue, known)

    def finish(self, repo: str, issue: ForgeIssue, known: Settling | None = None) -> dict[str, Any]:
        """The task change for a closed issue: its final result (status, result, when it
        finished) if settled, else `settling` with the result read so far; `missing` when
        the issue was deleted. `known`: the previous reading, whose pull details are reused."""
        try:
            reading = self._read(repo, issue, known)
        except ForgeNotFound:
            return ended(TaskStatus.MISSING, "the issue was deleted")
        snapshot = Settling(
            status=reading.status,
            result=reading.result,
            closed_at=reading.closed_at,
            changed_at=reading.changed_at,
            seen=listing_key(issue),
        )
        return self.settled_change(snapshot) or {"settling": snapshot}

    def _read(self, repo: str, issue: ForgeIssue, known: Settling | None) -> Reading:
        reading = read_result(issue, self.gitea.timeline(repo, issue.number), self.rules)
        pull = reading.result.pull_request
        if pull is None or not pull.merged or not self.settings.pull_details:
            return reading
        pull = self._pull_details(repo, pull, known.result.pull_request if known else None)
        return reading._replace(result=reading.result.model_copy(update={"pull_request": pull}))

    def _pull_details(
        self, repo: str, pull: PullRequestRef, known: PullRequestRef | None
    ) -> PullRequestRef:
        """Merge sha and size of a merged pull request: one GET, none when read before."""
        if known is not None and known.number == pull.number and known.merge_commit_sha:
            return known
        try:
            got = self.gitea.get_pull(repo, pull.number)
        except ForgeNotFound:
            return pull
        return pull.model_copy(
            update={
                "url": got.html_url or pull.url,
                "merged_at": got.merged_at or pull.merged_at,
                "merge_commit_sha": got.merge_commit_sha or None,
                "additions": got.additions,
                "deletions": got.deletions,
                "changed_files": got.changed_files,
            }
        )

    def settled_change(self, snapshot: Settling) -> dict[str, Any] | None:
        """The final change once nothing changed for `settle_seconds` (forge clock)."""
        wait = self.settings.settle_seconds
        now = self.gitea.listed_at or utcnow()
        if wait > 0 and now - snapshot.changed_at < timedelta(seconds=wait):
            return None
        return settled(snapshot)


def listing_key(issue: ForgeIssue) -> str:
    """What the issue listing shows of an issue's changes. `updated_at` has whole seconds
    only, so the labels and the comment count also tell a change within the same second."""
    labels = ",".join(sorted(issue.labels))
    return f"{issue.updated_at.isoformat()}|{issue.state}|{issue.comments}|{labels}"


def settled(snapshot: Settling) -> dict[str, Any]:
    """The change that finishes a task with the result read while it settled."""
    return {
        "status": snapshot.status,
        "result": snapshot.result,
        "finished_at": snapshot.closed_at or utcnow(),
        "settling": None,
    }


def ended(status: TaskStatus, why: str) -> dict[str, Any]:
    """The change that finishes a task without the lane's verdict."""
    return {"status": status, "result": TaskResult(summary=why), "finished_at": utcnow()}
