"""Poller: closed issues -> task results, one paged listing per repo for all its batches.

Each listed issue goes to the `ResultReader` (reading.py), which reads a closed issue's
result as of its settle moment and keeps it `settling` until then. With a settle time, the
listing also shows open issues (a reopen before the settle moment sends the task back to
running; one after it changes nothing); the settling issues the listing does not show are
listed since their close (settlelisting.py), or each read on its own when that is cheaper or
they are not there. Readings are per issue: a
forge error reading one delays that issue only (the batch's `attempts` count failed shared
work, the listing; an issue unreadable for good is ended by the batch's deadline). The
periodic full visit reconciles the listing with the forge's open-issue count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from ..config import Settings
from ..errors import ForgeError, ForgeNotFound
from ..forge.client import ForgeIssue, GiteaClient, UsesForge
from ..models import BatchRecord, BatchStatus, TaskRecord, utcnow
from ..ports import Closing
from ..store import Store
from .opentasks import OpenTasks, Owner
from .reading import LOCAL_CLOCK_MARGIN, ResultReader, gone
from .readpool import ReadPool, chunks
from .recording import VisitChanges
from .repomoves import follow_moves
from .settlelisting import SettlingListing

log = logging.getLogger("dropbox_eval")

# `since` is taken from the forge's own clock (the Date of the previous listing), so one
# second covers its whole-second precision; our clock is used only without a Date header.
SINCE_OVERLAP = timedelta(seconds=1)
COUNT_SKEW = timedelta(seconds=3)
ALARM_MARGIN = 0.3  # after a settle window's end: the forge's Date has whole seconds
Listed = tuple[list[ForgeIssue], "datetime | None"]  # issues a search found, its forge time
Counted = tuple[int, "datetime | None"]  # a repo's open issues, the forge time of the count
Change = dict[str, Any] | None  # what one reading changes on its task
_Read = tuple[Owner, int, Callable[[], Change]]  # a task, its issue number, how to read it


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
        self,
        store: Store,
        gitea: GiteaClient | None,
        settings: Settings,
        close: Closing,
        on_settling: Callable[[str, float], None] | None = None,
    ) -> None:
        """`close` closes a batch whose every task finished; `on_settling` is told when a
        repo's settling results are due (the service sets an alarm for it)."""
        self.store = store
        self._gitea = gitea
        self.settings = settings
        self.close = close
        self._checked: set[str] = set()  # batches whose counters agreed with their tasks
        # batches whose last full visit trusted the count and listed nothing: the count also
        # holds open issues of no polled batch, so the next visit of these must list
        self._unlisted: set[str] = set()
        self.reader = ResultReader(gitea, settings)
        self.listing = SettlingListing(gitea, settings, self.reader)
        self.on_settling = on_settling

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
        batches = follow_moves(self.store, self.gitea, batches)
        open_tasks = OpenTasks(self.store, batches, self._checked)
        if full and not probe:
            open_tasks.load_all()
        started = utcnow() - LOCAL_CLOCK_MARGIN
        changes = VisitChanges(self.store, open_tasks, self._checked)
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
            polled_at = batch.last_polled_at if batch.batch_id in unread else started
            now_tasks = changes.applied(batch.batch_id)
            if now_tasks is None:  # no listed issue was its: its counters stand
                self.store.update_batch(batch.batch_id, last_polled_at=polled_at)
                continue
            self._checked.discard(batch.batch_id)  # until its counters are written again
            self.refresh_progress(batch, now_tasks, polled_at)
            self._checked.add(batch.batch_id)
            self._alarm(batch.repo, now_tasks)
        follow_moves(self.store, self.gitea, batches)  # a redirect this visit followed
        return {batch_id: list(done) for batch_id, done in changes.finished.items()}

    def _list_closed(
        self,
        batches: list[BatchRecord],
        open_tasks: OpenTasks,
        listing: _Listing,
        changes: VisitChanges,
        unread: set[str],
    ) -> datetime | None:
        """The listing's forge time; `_NOT_LISTED` when a count showed nothing to list."""
        repo = batches[0].repo
        listed, full = listing.listed, listing.full
        if listed is not None and not full:  # a search found what changed: no listing
            self.gitea.listed_at = listed[1]
            self._collect_closed(repo, open_tasks, None, False, unread, changes, listed[0])
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
        # open tasks' issues listed closed: (closed_at, whether no result was settling)
        closed: dict[int, tuple[datetime | None, bool]] = {}
        if not full or listing.probe:
            self._collect_closed(
                repo, open_tasks, since, False, unread, changes, closed=closed, repair=repair
            )
            listed_at = self.gitea.listed_at
            unsettled -= sum(  # a closure after the count must not hide a deleted issue
                1
                for closed_at, was_unsettled in closed.values()
                if was_unsettled and _before(closed_at, counted_at)
            )
            if count is None or count >= unsettled:
                return listed_at
        # an issue vanished: list every issue, check the ones the listing cannot see
        open_tasks.load_all()
        self._collect_closed(repo, open_tasks, None, True, unread, changes, skip=set(closed))
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
        changes: VisitChanges,
        listed: list[ForgeIssue] | None = None,
        *,
        closed: dict[int, tuple[datetime | None, bool]] | None = None,
        skip: set[int] | None = None,
        repair: bool = True,
    ) -> None:
        """Record the open tasks' changes from a listing, a few pages at a time (readpool.py:
        no page's issue models outlive its reads); `closed` collects the open tasks' issue
        numbers it showed closed; `skip`: issues an earlier listing already read."""
        seen: set[int] = set(skip or ())
        # open issues too: a reopen of a settling one, and a close and reopen between two
        # visits (a settled close stands, reading.py)
        state = "all" if full or open_tasks.settling() or self.settings.settle_seconds else "closed"
        issues: Iterable[ForgeIssue] = (
            listed
            if listed is not None
            else self.gitea.iter_issues(
                repo, state=state, labels=self.settings.task_label, since=since, repair=repair
            )
        )
        with ReadPool(self.gitea) as pool:
            for page in chunks(issues):
                reads: list[_Read] = []
                calls = 0  # closed issues' reads ask the forge; open ones' seldom
                for issue in page:
                    if issue.number in seen:
                        continue
                    seen.add(issue.number)
                    owner = open_tasks.owner(issue)
                    if owner is None:
                        continue
                    if issue.state == "closed":
                        calls += 1
                        if closed is not None:
                            closed[issue.number] = (issue.closed_at, owner[1].settling is None)
                    observe = partial(self.reader.observe, repo, owner[1], issue, _seen(owner))
                    reads.append((owner, issue.number, observe))
                del page
                self._record(pool, reads, calls, unread, changes)
            if not full:  # the settling ones listed since their close, not one GET each
                settling = [n for n, o in open_tasks.read() if o[1].settling is not None]
                for part in chunks(self.listing.reads(repo, settling, open_tasks.get, seen)):
                    self._record(pool, part, len(part), unread, changes)
            for part in chunks(self._unseen_reads(repo, open_tasks, seen, full)):
                self._record(pool, part, len(part), unread, changes)

    def _unseen_reads(
        self, repo: str, open_tasks: OpenTasks, seen: set[int], full: bool
    ) -> Iterator[_Read]:
        """Reads of the open tasks the listing did not show: each a forge call."""
        for number in open_tasks.numbers():
            owner = open_tasks.get(number)
            if number in seen or owner is None:  # read, or let go since
                continue
            if full:
                yield (owner, number, partial(self._check_unseen, repo, owner[1], _seen(owner)))
            elif owner[1].settling is not None:  # not listed: its issue is read on its own
                yield (owner, number, partial(self.reader.settle_unlisted, repo, owner[1]))

    def _record(
        self,
        pool: ReadPool,
        reads: list[_Read],
        calls: int,
        unread: set[str],
        changes: VisitChanges,
    ) -> None:
        """Run one page's reads and store the changes they make."""
        outcomes = pool.run([one[2] for one in reads], calls)
        for (owner, number, _), change in zip(reads, outcomes, strict=True):
            if isinstance(change, ForgeError):
                log.warning(
                    "batch %s: result of issue #%d unreadable, retried next cycle: %s",
                    owner[0].batch_id,
                    number,
                    change,
                )
                unread.add(owner[0].batch_id)
            elif change is not None:
                changes.add(owner, change)
        changes.flush()

    def _check_unseen(
        self, repo: str, task: TaskRecord, since: datetime | None
    ) -> dict[str, Any] | None:
        try:
            issue = self.gitea.get_issue(repo, task.issue_number or 0)
        except ForgeNotFound:
            return gone("the issue was deleted before the lane finished it")
        return self.reader.observe(repo, task, issue, since)

    def _alarm(self, repo: str, tasks: list[TaskRecord]) -> None:
        """Ask for a visit of `repo` when its first settling result is due."""
        due = [t.settling.changed_at for t in tasks if t.settling is not None]
        if not due or self.on_settling is None:
            return
        now = self.gitea.listed_at or utcnow()  # the forge's clock, as the window is
        window = timedelta(seconds=self.settings.settle_seconds)
        seconds = (min(due) + window - now).total_seconds()
        self.on_settling(repo, max(0.0, seconds) + ALARM_MARGIN)

    def refresh_progress(
        self, batch: BatchRecord, tasks: list[TaskRecord], polled_at: datetime | None
    ) -> BatchRecord:
        """Store the progress; a batch whose every task finished is settled `completed`."""
        done = sum(1 for t in tasks if t.status.is_finished)
        if done == len(tasks):
            closed = self.close(batch.batch_id, tasks, BatchStatus.COMPLETED, polled_at=polled_at)
            log.info("batch %s: all %d tasks finished", batch.batch_id, done)  # once: closed
            return closed
        fields: dict[str, Any] = {"last_polled_at": polled_at}
        if done != batch.done:
            fields["done"] = done  # the index row is rewritten only when progress moved
        settling = sum(1 for t in tasks if t.settling is not None)
        if settling != batch.settling_tasks:
            fields["settling_tasks"] = settling
        return self.store.update_batch(batch.batch_id, **fields)


def _before(moment: datetime | None, mark: datetime | None) -> bool:
    """Whether `moment` (an issue's `closed_at`) may be before `mark` (the count's `Date`);
    without a mark, everything is. The two clocks are whole seconds and need not agree to
    the second (a server's cached `Date`, a proxy's own): `COUNT_SKEW` of slack, so a
    closure just before the count never costs a full listing; a deletion hidden by a
    closure within it is found by the next full cycle."""
    return mark is None or (moment is not None and moment <= mark + COUNT_SKEW)


def _seen(owner: Owner) -> datetime | None:
    """The forge time up to which the listings showed the owner's batch."""
    return owner[0].last_polled_at
