"""ResultReader: a listed issue -> the change it makes to its open task.

A task's result is its issue's forge history as of the settle moment (asof.py, README
"Lane result protocol"), never a function of when the service looked. A closed issue waits
(`settling`, read nothing) until the listing shows nothing changed for `settle_seconds`;
then its timeline (and the pull request's details) is read, the settle moment found in it
and the history cut there. What the listing cannot show counts too: a comment edit moves
the comment's `updated_at`, not the issue's, so a reading that finds the issue not settled
yet settles again from its last change. An open issue that may have been closed and
settled before a reopen the service never saw is read too: a settled close stands.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ..config import Settings
from ..errors import ForgeNotFound
from ..forge.client import ForgeIssue, GiteaClient, UsesForge
from ..forge.wire import ForgeRefIssue
from ..models import PullRequestRef, Settling, TaskRecord, TaskResult, TaskStatus, utcnow
from .asof import as_of, settled_change
from .lane import Reading, VerdictRules, read_result

READERS = 16  # closed issues of one repo read at once, at most
LOCAL_CLOCK_MARGIN = timedelta(minutes=2)  # our clock against the forge's


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

    def observe(
        self, repo: str, task: TaskRecord, issue: ForgeIssue, since: datetime | None = None
    ) -> dict[str, Any] | None:
        """The change a listed issue makes to its open task: none while open (back to
        running when it was reopened before settling); once closed, `settling` until the
        settle time passed, then the result as of its settle moment. An open issue that
        may have settled before a reopen the service did not see (it changed more than the
        settle time after `since`, the forge time its batch was last listed at, or after
        the close the task settles from) is read: a settled close stands."""
        known = task.settling
        if issue.state != "closed":
            if self._may_have_settled(task, issue, since):
                return self._reopened(repo, task, issue)
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
        """The final change of a settling task read now (a batch ending early keeps what
        the lane did): the result as of its settle moment, else as it stands; back to
        running (`settling` None) when the issue is open again and never settled."""
        assert task.settling is not None
        try:
            issue = self.gitea.get_issue(repo, task.issue_number or 0)
        except ForgeNotFound:
            return gone("the issue was deleted")
        reopened = issue.state != "closed"
        change = self._decide(
            repo,
            issue,
            task.settling,
            listing_key(issue),
            lambda snapshot: {"settling": None} if reopened else settled(snapshot),
        )
        assert change is not None
        return change

    def settle(self, repo: str, issue: ForgeIssue, known: Settling) -> dict[str, Any]:
        """Read a closed issue the listing calls settled: its result as of the settle
        moment, or `settling` again when the timeline shows a change the listing could not
        (an edit) that has not settled yet; `missing` when the issue was deleted."""
        change = self._decide(repo, issue, known, known.seen, lambda s: {"settling": s})
        assert change is not None
        return change

    def _reopened(self, repo: str, task: TaskRecord, issue: ForgeIssue) -> dict[str, Any] | None:
        back = None if task.settling is None else {"settling": None}
        return self._decide(repo, issue, task.settling, listing_key(issue), lambda _s: back)

    def _decide(
        self,
        repo: str,
        issue: ForgeIssue,
        known: Settling | None,
        seen: str,
        unsettled: Callable[[Settling], dict[str, Any] | None],
    ) -> dict[str, Any] | None:
        """Read an issue: its result as of the settle moment when it settled (`missing`
        when it was deleted), else what `unsettled` makes of the reading."""
        try:
            reading = self._read(repo, issue, known)
        except ForgeNotFound:
            return gone("the issue was deleted")
        snapshot = snapshot_of(reading, seen)
        return settled(snapshot) if reading.settled else unsettled(snapshot)

    def _may_have_settled(
        self, task: TaskRecord, issue: ForgeIssue, since: datetime | None
    ) -> bool:
        """Whether an issue seen open may have been closed for the settle time since it
        was last seen: it changed at least that long after then (and a whole second, the
        forge's precision, for a close and a reopen at two instants)."""
        seen = task.settling.changed_at if task.settling is not None else since
        seen = seen or task.created_at - LOCAL_CLOCK_MARGIN
        gap = max(timedelta(seconds=self.settings.settle_seconds), timedelta(seconds=1))
        return issue.updated_at - seen >= gap

    def _read(self, repo: str, issue: ForgeIssue, known: Settling | None) -> Reading:
        def merge_commit(ref: ForgeRefIssue) -> str | None:
            return self.gitea.get_pull(ref.repo or repo, ref.number).merge_commit_sha

        timeline = self.gitea.timeline(repo, issue)
        now = self.gitea.read_at or self.gitea.listed_at or utcnow()  # when it was read
        window = timedelta(seconds=self.settings.settle_seconds)
        last = settled_change(issue, timeline, window, now)
        if last is not None:
            issue, timeline, _ = as_of(issue, timeline, last, window)
        reading = read_result(issue, timeline, self.rules, merge_commit, last)
        pull = reading.result.pull_request
        if pull is None or not pull.merged or not self.settings.pull_details:
            return reading
        before = known.result.pull_request if known and known.result is not None else None
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
