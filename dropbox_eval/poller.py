"""Poller: closed issues -> task results, one paged listing per repo for all its batches.

A closed issue is read once (its timeline, plus the merged pull request with `pull_details`)
and its result kept on the task as `settling`; the task finishes only once nothing about the
issue changed for `settle_seconds`, because a lane's close, label and verdict comment are
separate API calls that may arrive seconds apart and in any order. While settling, the
listing also shows open issues (a reopen sends the task back to running) and an issue is
read again only when the listing shows it changed (see `listing_key`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .config import Settings
from .errors import ForgeError, ForgeNotFound
from .forge import ForgeIssue, GiteaClient, UsesForge
from .models import (
    BatchRecord,
    BatchStatus,
    PullRequestRef,
    Settling,
    TaskRecord,
    TaskResult,
    TaskStatus,
    utcnow,
)
from .opentasks import OpenTasks, Owner
from .report import Reading, VerdictRules, read_result
from .settle import Settler
from .store import Store

log = logging.getLogger("dropbox_eval")

# `since` is taken from the forge's own clock (the Date of the previous listing), so one
# second covers its whole-second precision; our clock is used only without a Date header.
SINCE_OVERLAP = timedelta(seconds=1)
LOCAL_CLOCK_MARGIN = timedelta(minutes=2)
COUNT_SKEW = timedelta(seconds=3)
Listed = tuple[list[ForgeIssue], "datetime | None"]  # issues a search found, its forge time
Counted = tuple[int, "datetime | None"]  # a repo's open issues, the forge time of the count


_NOT_LISTED = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _Listing:
    """How one repo visit lists its issues (see `Poller.poll_batches`)."""

    full: bool
    probe: bool
    open_count: Counted | None
    listed: Listed | None


class Poller(UsesForge):
    """Stores the results of issues the lane closed and moves each batch's progress."""

    def __init__(
        self, store: Store, gitea: GiteaClient | None, settings: Settings, settler: Settler
    ) -> None:
        self.store = store
        self._gitea = gitea
        self.settings = settings
        self.settler = settler
        self._checked: set[str] = set()  # batches whose counters agreed with their tasks
        # batches whose last full visit trusted the count and listed nothing: the count also
        # holds open issues of no polled batch, so the next visit of these must list
        self._unlisted: set[str] = set()
        self.rules = VerdictRules(
            labels={name: TaskStatus(s) for name, s in settings.label_results.items()},
            merged=TaskStatus(settings.merged_status),
            unmerged=TaskStatus(settings.unmerged_status),
        )

    def poll_completed(self, batch_id: str, *, full: bool = False) -> list[str]:
        """Store results of issues the lane closed; open ones are skipped (seed API)."""
        return self.poll_batches([batch_id], full=full).get(batch_id, [])

    def poll_batches(
        self,
        batch_ids: list[str],
        *,
        full: bool = False,
        probe: bool = True,
        listed: Listed | None = None,
        open_count: Counted | None = None,
    ) -> dict[str, list[str]]:
        """Poll running batches that share one repo with a single paged listing.

        A normal poll asks only for issues closed since the oldest last poll (with an
        overlap for clock skew), so its requests depend on what changed, not on how many
        tasks are open. `full` reconciles against the forge's open-issue count (`open_count`
        when the caller already has it, else one count request with `probe`): a count that
        agrees with the store needs no listing this time; one that is short is explained by
        the incremental listing, and when it is not, every issue is listed and the ones it
        cannot see are checked one by one, so a deleted issue finishes its task as
        `missing`. `full` without `probe` lists everything at once. `listed`: the repo's
        issues changed since its batches were polled, found by a cross-repo search, with
        the forge time of that search; then no listing is sent. Returns finished task ids.
        """
        batches = [
            b for b in map(self.store.get_batch, batch_ids) if b.status == BatchStatus.RUNNING
        ]
        if not batches:
            return {}
        open_tasks = OpenTasks(self.store, batches, self._checked)
        if full and not probe:
            open_tasks.load_all()
        started = utcnow() - LOCAL_CLOCK_MARGIN
        changes: dict[str, dict[str, dict[str, Any]]] = {b.batch_id: {} for b in batches}
        unread: set[str] = set()  # batches with a result that could not be read this time
        if open_tasks.open():
            listing = _Listing(full, probe, open_count, listed)
            listed_at = self._list_closed(batches, open_tasks, listing, changes, unread)
            if listed_at is _NOT_LISTED:  # the count agreed: the next poll covers this one
                unread.update(b.batch_id for b in batches)
                self._unlisted.update(b.batch_id for b in batches)
            else:
                self._unlisted.difference_update(b.batch_id for b in batches)
            started = listed_at or started
        for batch in batches:
            changed = changes[batch.batch_id]
            polled_at = batch.last_polled_at if batch.batch_id in unread else started
            tasks = open_tasks.tasks.get(batch.batch_id)
            if tasks is None:  # no listed issue was its: its counters stand
                self.store.update_batch(batch.batch_id, last_polled_at=polled_at)
                continue
            self._checked.discard(batch.batch_id)  # until its counters are written again
            self.store.update_tasks(batch.batch_id, changed)
            for task_id, change in changed.items():
                _log_change(batch.batch_id, task_id, change)
            self.refresh_progress(batch, _applied(tasks, changed), polled_at)
            self._checked.add(batch.batch_id)
        return {
            batch_id: [task_id for task_id, change in changed.items() if "status" in change]
            for batch_id, changed in changes.items()
        }

    def _list_closed(
        self,
        batches: list[BatchRecord],
        open_tasks: OpenTasks,
        listing: _Listing,
        changes: dict[str, dict[str, dict[str, Any]]],
        unread: set[str],
    ) -> datetime | None:
        """The listing's forge time; `_NOT_LISTED` when a count showed nothing to list."""
        repo = batches[0].repo
        listed, full = listing.listed, listing.full
        if listed is not None and not full:  # a search found what changed: no listing
            self.gitea.listed_at = listed[1]
            for (batch, task), change in self._collect_closed(
                repo, open_tasks, None, False, unread, listed[0]
            ):
                changes[batch.batch_id][task.task_id] = change
            return listed[1]
        polled = [b.last_polled_at for b in batches if b.last_polled_at is not None]
        since = min(polled) - SINCE_OVERLAP if len(polled) == len(batches) else None
        unsettled = open_tasks.unsettled()
        count, counted_at = listing.open_count or (None, None)
        repair = True  # an empty listing without `since` may mean duplicate labels
        self.gitea.listed_at = None
        if full and listing.probe:
            if count is None:  # counting by label merges duplicate labels first
                count = self.gitea.count_issues(repo, state="open", labels=self.settings.task_label)
                counted_at, repair = self.gitea.listed_at, False
            if (
                since is not None
                and count >= unsettled == open_tasks.open()
                and self._may_skip(batches)
            ):
                return _NOT_LISTED  # nothing closed or vanished, nothing settling
        listed_at = None
        closed: dict[int, datetime | None] = {}  # open tasks' issues listed closed: closed_at
        if not full or listing.probe:
            for (batch, task), change in self._collect_closed(
                repo, open_tasks, since, False, unread, closed=closed, repair=repair
            ):
                changes[batch.batch_id][task.task_id] = change
            listed_at = self.gitea.listed_at
            unsettled -= sum(  # a closure after the count must not hide a deleted issue
                1
                for n, closed_at in closed.items()
                if _unsettled(open_tasks.get(n)) and _before(closed_at, counted_at)
            )
            if count is None or count >= unsettled:
                return listed_at
        # an issue vanished: list every issue, check the ones the listing cannot see
        open_tasks.load_all()
        for (batch, task), change in self._collect_closed(
            repo, open_tasks, None, True, unread, skip=set(closed)
        ):
            changes[batch.batch_id][task.task_id] = change
        return self.gitea.listed_at or listed_at

    def _may_skip(self, batches: list[BatchRecord]) -> bool:
        """Whether a later visit of this process will list what a skip leaves out: only
        batches it listed before (not a `run --once`), never twice in a row (not with
        `full_poll_every` 1)."""
        return all(
            b.batch_id in self._checked and b.batch_id not in self._unlisted for b in batches
        )

    def _collect_closed(
        self,
        repo: str,
        open_tasks: OpenTasks,
        since: datetime | None,
        full: bool,
        unread: set[str],
        listed: list[ForgeIssue] | None = None,
        *,
        closed: dict[int, datetime | None] | None = None,
        skip: set[int] | None = None,
        repair: bool = True,
    ) -> Iterator[tuple[Owner, dict[str, Any]]]:
        """Changes of the open tasks from a listing; `closed` collects the open tasks'
        issue numbers it showed closed; `skip`: issues an earlier listing already read."""
        seen: set[int] = set(skip or ())
        state = "all" if full or open_tasks.settling() else "closed"  # reopens count too
        issues: Iterable[ForgeIssue] = (
            listed
            if listed is not None
            else self.gitea.iter_issues(
                repo, state=state, labels=self.settings.task_label, since=since, repair=repair
            )
        )
        for issue in issues:
            if issue.number in seen:
                continue
            seen.add(issue.number)
            owner = open_tasks.owner(issue)
            if owner is None:
                continue
            if closed is not None and issue.state == "closed":
                closed[issue.number] = issue.closed_at
            try:
                change = self.observe(repo, owner[1], issue)
            except ForgeError as exc:
                log.warning(
                    "batch %s: result of issue #%d unreadable, retried next cycle: %s",
                    owner[0].batch_id,
                    issue.number,
                    exc,
                )
                unread.add(owner[0].batch_id)
                continue
            if change is not None:
                yield owner, change
        for number, owner in open_tasks.read():
            if number in seen:
                continue
            if full:
                change = self._check_unseen(repo, owner[1])
            elif owner[1].settling is not None:  # unchanged since it was read
                change = self._settled(owner[1].settling)
            else:
                change = None
            if change is not None:
                yield owner, change

    def _check_unseen(self, repo: str, task: TaskRecord) -> dict[str, Any] | None:
        try:
            issue = self.gitea.get_issue(repo, task.issue_number or 0)
        except ForgeNotFound:
            return ended(TaskStatus.MISSING, "the issue was deleted before the lane finished it")
        return self.observe(repo, task, issue)

    def observe(self, repo: str, task: TaskRecord, issue: ForgeIssue) -> dict[str, Any] | None:
        """The change a listed issue makes to its open task: none while open (back to
        running when it was reopened before settling); once closed, its result read from
        the timeline (again only if the issue changed), final when settled."""
        known = task.settling
        if issue.state != "closed":
            return None if known is None else {"settling": None}
        if known is not None and known.seen == listing_key(issue):
            return self._settled(known)
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
        return self._settled(snapshot) or {"settling": snapshot}

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

    def _settled(self, snapshot: Settling) -> dict[str, Any] | None:
        """The final change once nothing changed for `settle_seconds` (forge clock)."""
        wait = self.settings.settle_seconds
        now = self.gitea.listed_at or utcnow()
        if wait > 0 and now - snapshot.changed_at < timedelta(seconds=wait):
            return None
        return settled(snapshot)

    def refresh_progress(
        self, batch: BatchRecord, tasks: list[TaskRecord], polled_at: datetime | None
    ) -> BatchRecord:
        """Store the progress; a batch whose every task finished is settled `completed`."""
        done = sum(1 for t in tasks if t.status.is_finished)
        if done == len(tasks):
            log.info("batch %s: all %d tasks finished", batch.batch_id, done)
            return self.settler.close(
                batch.batch_id, tasks, BatchStatus.COMPLETED, polled_at=polled_at
            )
        fields: dict[str, Any] = {"last_polled_at": polled_at}
        if done != batch.done:
            fields["done"] = done  # the index row is rewritten only when progress moved
        settling = sum(1 for t in tasks if t.settling is not None)
        if settling != batch.settling_tasks:
            fields["settling_tasks"] = settling
        return self.store.update_batch(batch.batch_id, **fields)


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


def _log_change(batch_id: str, task_id: str, change: dict[str, Any]) -> None:
    if "status" in change:
        log.info("batch %s: task %s finished as %s", batch_id, task_id, change["status"])
    elif change.get("settling") is None:
        log.info("batch %s: task %s reopened before settling; polled again", batch_id, task_id)
    else:
        log.debug("batch %s: task %s closed; settling", batch_id, task_id)


def ended(status: TaskStatus, why: str) -> dict[str, Any]:
    """The change that finishes a task without the lane's verdict."""
    return {"status": status, "result": TaskResult(summary=why), "finished_at": utcnow()}


def _before(moment: datetime | None, mark: datetime | None) -> bool:
    """Whether `moment` (an issue's `closed_at`) may be before `mark` (the count's `Date`);
    without a mark, everything is. The two clocks are whole seconds and need not agree to
    the second (a server's cached `Date`, a proxy's own): `COUNT_SKEW` of slack, so a
    closure just before the count never costs a full listing; a deletion hidden by a
    closure within it is found by the next full cycle."""
    return mark is None or (moment is not None and moment <= mark + COUNT_SKEW)


def _unsettled(owner: Owner | None) -> bool:
    return owner is not None and owner[1].settling is None


def _applied(tasks: list[TaskRecord], changes: dict[str, dict[str, Any]]) -> list[TaskRecord]:
    """The tasks as they are after `changes` were stored."""
    return [t.model_copy(update=changes[t.task_id]) if t.task_id in changes else t for t in tasks]
