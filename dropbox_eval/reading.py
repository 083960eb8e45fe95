"""ResultReader: a listed issue -> the change it makes to its open task.

A task's result is a function of its issue's forge history, never of when the service
looked (README "Lane result protocol"). A closed issue waits (`settling`, read nothing)
until nothing about it changed for `settle_seconds`, because a lane's close, label and
verdict comment are separate API calls that may arrive seconds apart and in any order; then
its timeline (and the pull request's details) is read once, at that moment. What the
listing cannot show counts too: a comment edit moves the comment's `updated_at`, not the
issue's, so a reading that finds a change newer than the one it settled from settles again
from it; a pull request merged after the issue was closed changes nothing on the issue, and
is read as it is at the end (merged, not the closer).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .config import Settings
from .errors import ForgeError, ForgeNotFound
from .forge import ForgeIssue, GiteaClient, UsesForge
from .forgewire import ForgeRefIssue
from .models import PullRequestRef, Settling, TaskRecord, TaskResult, TaskStatus, utcnow
from .report import Reading, VerdictRules, read_result

READERS = 16  # closed issues of one repo read at once, at most
T = TypeVar("T")


class ResultReader(UsesForge):
    """Reads the result of an issue the lane closed once it settled."""

    def __init__(self, gitea: GiteaClient | None, settings: Settings) -> None:
        self._gitea = gitea
        self.settings = settings
        self.rules = VerdictRules(
            labels={name: TaskStatus(s) for name, s in settings.label_results.items()},
            merged=TaskStatus(settings.merged_status),
            unmerged=TaskStatus(settings.unmerged_status),
            lane_login=settings.lane_login,
            lane_marker=settings.lane_marker,
        )

    def observe(self, repo: str, task: TaskRecord, issue: ForgeIssue) -> dict[str, Any] | None:
        """The change a listed issue makes to its open task: none while open (back to
        running when it was reopened before settling); once closed, `settling` until the
        settle time passed, then the result read at that moment."""
        known = task.settling
        if issue.state != "closed":
            return None if known is None else {"settling": None}
        if known is None or known.seen != listing_key(issue):
            known = Settling(
                closed_at=issue.closed_at,
                changed_at=max(issue.updated_at, issue.closed_at or issue.updated_at),
                seen=listing_key(issue),
            )
            if not self.is_due(known):
                return {"settling": known}
        elif not self.is_due(known):
            return None
        return self.settle(repo, issue, known)

    def settle_unlisted(self, repo: str, task: TaskRecord) -> dict[str, Any] | None:
        """The change of a settling task whose issue the listing did not show: its issue
        read on its own (one GET per visit while it settles), then `observe`d as listed.
        So a deleted issue is `missing` at this visit, a reopen or a change the listing did
        not show (a label) counts now, and the result comes from what this read fetched,
        never from the labels the listing showed before."""
        if task.settling is None:
            return None
        try:
            issue = self.gitea.get_issue(repo, task.issue_number or 0)
        except ForgeNotFound:
            return gone("the issue was deleted")
        return self.observe(repo, task, issue)

    def read_now(self, repo: str, task: TaskRecord) -> dict[str, Any]:
        """The final change of a settling task read now, settled or not (a batch ending
        early keeps what the lane did)."""
        assert task.settling is not None
        try:
            reading = self._read(repo, listed_issue(task, task.settling), task.settling)
        except ForgeNotFound:
            return gone("the issue was deleted")
        return settled(snapshot_of(reading, task.settling.seen))

    def settle(self, repo: str, issue: ForgeIssue, known: Settling) -> dict[str, Any]:
        """Read a settled issue: its final change, or `settling` again when the reading
        shows a change the listing could not (an edit) that has not settled yet;
        `missing` when the issue was deleted."""
        try:
            reading = self._read(repo, issue, known)
        except ForgeNotFound:
            return gone("the issue was deleted")
        snapshot = snapshot_of(reading, known.seen)
        if reading.changed_at > known.changed_at and not self.is_due(snapshot):
            return {"settling": snapshot}
        return settled(snapshot)

    def _read(self, repo: str, issue: ForgeIssue, known: Settling) -> Reading:
        def merge_commit(ref: ForgeRefIssue) -> str | None:
            return self.gitea.get_pull(ref.repo or repo, ref.number).merge_commit_sha

        timeline = self.gitea.timeline(repo, issue)
        reading = read_result(issue, timeline, self.rules, merge_commit)
        pull = reading.result.pull_request
        if pull is None or not pull.merged or not self.settings.pull_details:
            return reading
        before = known.result.pull_request if known.result is not None else None
        pull = self._pull_details(pull.repo or repo, pull, before)
        return reading._replace(result=reading.result.model_copy(update={"pull_request": pull}))

    def _pull_details(
        self, repo: str, pull: PullRequestRef, known: PullRequestRef | None
    ) -> PullRequestRef:
        """Merge sha and size of a merged pull request, from the repo it lives in: one GET,
        none when read before."""
        same = known is not None and (known.number, known.repo) == (pull.number, pull.repo)
        if same and known is not None and known.merge_commit_sha:
            return pull.model_copy(update=_details(known))
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

    def is_due(self, snapshot: Settling) -> bool:
        """Whether nothing changed for `settle_seconds` (the forge's clock)."""
        wait = self.settings.settle_seconds
        now = self.gitea.listed_at or utcnow()
        return wait <= 0 or now - snapshot.changed_at >= timedelta(seconds=wait)


def listing_key(issue: ForgeIssue) -> str:
    """What the issue listing shows of an issue's changes. `updated_at` has whole seconds
    only, so the labels and the comment count also tell a change within the same second."""
    labels = ",".join(sorted(issue.labels))
    return f"{issue.updated_at.isoformat()}|{issue.state}|{issue.comments}|{labels}"


def listed_issue(task: TaskRecord, known: Settling) -> ForgeIssue:
    """The issue as the listing last showed it (`listing_key` keeps what a reading needs):
    a settling task's issue that did not change is read without listing it again."""
    updated, state, comments, labels = known.seen.split("|", 3)
    return ForgeIssue(
        number=task.issue_number or 0,
        title=task.payload.title,
        state=state,
        labels=[name for name in labels.split(",") if name],
        html_url=task.issue_url or "",
        updated_at=datetime.fromisoformat(updated),
        closed_at=known.closed_at,
        comments=int(comments),
    )


def snapshot_of(reading: Reading, seen: str) -> Settling:
    """A reading kept on its task."""
    return Settling(
        status=reading.status,
        result=reading.result,
        closed_at=reading.closed_at,
        changed_at=reading.changed_at,
        seen=seen,
    )


def settled(snapshot: Settling) -> dict[str, Any]:
    """The change that finishes a task with its settled reading. A snapshot never read (the
    batch ended before it was, with the forge out of reach) ends `no_verdict`."""
    if snapshot.status is None or snapshot.result is None:
        why = "the lane closed the issue; the batch ended before its result could be read"
        return {**ended(TaskStatus.NO_VERDICT, why), "settling": None}
    return {
        "status": snapshot.status,
        "result": snapshot.result,
        "finished_at": snapshot.closed_at or utcnow(),
        "settling": None,
    }


def ended(status: TaskStatus, why: str) -> dict[str, Any]:
    """The change that finishes a task without the lane's verdict."""
    return {"status": status, "result": TaskResult(summary=why), "finished_at": utcnow()}


def gone(why: str) -> dict[str, Any]:
    """The change that finishes a task whose issue was deleted (settling or not)."""
    return {**ended(TaskStatus.MISSING, why), "settling": None}


def _details(known: PullRequestRef) -> dict[str, Any]:
    fields = ("url", "merged_at", "merge_commit_sha", "additions", "deletions", "changed_files")
    return {name: getattr(known, name) for name in fields}


def read_each(gitea: GiteaClient, reads: list[Callable[[], T]], calls: int) -> list[T | ForgeError]:
    """Each read's outcome, or the forge error that delays that read only (one issue's
    read never fails the others'). In parallel when `calls` of them ask the forge: each
    waits its client's turn at the scheduler, so the budget bounds them, not this pool."""
    listed_at = gitea.listed_at  # the listing's forge time, for every reader

    def read(one: Callable[[], T]) -> T | ForgeError:
        gitea.listed_at = listed_at
        try:
            return one()
        except ForgeError as exc:
            return exc

    if calls <= 1:
        return [read(one) for one in reads]
    with ThreadPoolExecutor(min(calls, READERS), thread_name_prefix="read") as pool:
        context = copy_context()
        return list(pool.map(lambda one: context.copy().run(read, one), reads))
