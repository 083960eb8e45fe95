"""ChangeScout: which repos a poll cycle must visit, found with one request.

With one repo per batch, listing every live repo costs one request per repo per cycle.
Instead, one cross-repo search (`/repos/issues/search`, owner, `since` the previous search)
names the issues that changed in any of them; only those repos are visited, and the
search's issues stand in for their listings. The search has no label filter (Gitea would
hand its indexer one label id per repo of the instance that has the label): the owner
filter bounds it, and an issue counts when its marker names a batch of the cycle (a batch
whose issues answer under another repo name is listed by its own name: a renamed repo
redirects, and the visit learns the new name). A repo is visited without a search result
when one of its batches has work of its own: a new batch, an intake to finish, a cancel, a
deadline, a retry, results still settling. Every
`full_poll_every`th cycle asks each repo's open-issue count instead (`/repos/search`, one
request per 50 repos) and visits only the repos whose count is lower than the store
expects: a closure the search missed (one incremental listing) or a deleted issue (that
repo listed in full). The next search's window starts where the previous search's ended,
so skipping it loses nothing.

Gitea answers the search from its issue indexer, updated through a queue; `since`
overlaps the previous search by `SEARCH_OVERLAP` (10 s: the queue normally drains within a
second, and a change the search misses is still found by a webhook, a later search whose
window covers it, or the full cycle's count).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..config import Settings
from ..forge.client import ForgeIssue, GiteaClient, require_client
from ..forge.markers import read_marker
from ..models import BatchRecord, TaskStatus, utcnow
from ..store import Store
from .opentasks import unsettled_of
from .poller import Counted, Listed
from .reading import LOCAL_CLOCK_MARGIN

SEARCH_OVERLAP = timedelta(seconds=10)


@dataclass
class Visit:
    """What a cycle does with one repo: list it (`listed` None), or use the search's
    issues; `full` lists everything and checks what the listing does not show."""

    listed: Listed | None = None
    full: bool = False
    probe: bool = True  # a full visit first asks the repo's count (unless already known)
    open_count: Counted | None = None  # the repo's open issues when the scout counted them


@dataclass
class ChangeScout:
    """Plans each cycle's repo visits from one search (per-batch repos only). `is_due`:
    whether a batch's stored retry is due (lifecycle.attempts)."""

    store: Store
    gitea: GiteaClient | None
    settings: Settings
    is_due: Callable[[BatchRecord], bool]
    searched_at: datetime | None = None
    # repo -> forge time up to which its changes are known (polled, or searched clean)
    known: dict[str, datetime] = field(default_factory=dict)
    counted: bool = False  # the last cycle asked the counts instead of searching
    planned: set[str] | None = None  # the batches the last search's plan read
    plan_seconds: float = 0.0  # from reading them to the search's answer

    def plan(self, by_repo: dict[str, list[str]], full: bool) -> dict[str, Visit]:
        """The visits of one cycle: repo -> Visit; repos left out need no request."""
        started = time.monotonic()
        batches = {repo: [self.store.get_batch(b) for b in ids] for repo, ids in by_repo.items()}
        since = self._since(batches.values())
        if since is None:  # a batch never polled: every repo is listed once, as before
            self.known = {}
            return {repo: Visit(full=full) for repo in batches}
        gitea = require_client(self.settings, self.gitea)
        owner = self.settings.require_owner()
        # a count cannot show a closure when another open issue keeps it up: skip the search
        # only when a later search of this process covers this cycle (not `run --once`)
        if full and self.searched_at is not None and not self.counted:
            self.counted = True
            every = gitea.open_counts(owner)
            return self._reconcile(batches, every, gitea.listed_at)
        counts = gitea.open_counts(owner) if full else None
        counted_at = gitea.listed_at
        gitea.listed_at = None
        searched = gitea.search_issues(owner, state="all", since=since)
        found, elsewhere = self._by_batch_repo(searched, batches)
        searched_at = gitea.listed_at or utcnow() - LOCAL_CLOCK_MARGIN
        plan: dict[str, Visit] = {}
        known: dict[str, datetime] = {}
        for repo, repo_batches in batches.items():
            issues = found.get(repo.casefold(), [])
            covered = self._covered(repo, repo_batches, since)
            if not covered or repo.casefold() in elsewhere:  # list the repo by its name
                plan[repo] = Visit()
            elif issues or any(map(self._own_work, repo_batches)):
                plan[repo] = Visit((issues, searched_at))
            else:  # searched clean; a visited repo's batches record their own poll
                known[repo] = searched_at
            count = counts.get(repo.casefold(), 0) if counts is not None else None
            if count is not None and count < self._expected(repo_batches, issues):
                plan[repo] = Visit(full=True, open_count=(count, counted_at))  # one vanished
        self.searched_at, self.known, self.counted = searched_at, known, False
        self.planned = {b.batch_id for group in batches.values() for b in group}
        self.plan_seconds = time.monotonic() - started
        return plan

    def _by_batch_repo(
        self, issues: Iterable[ForgeIssue], batches: dict[str, list[BatchRecord]]
    ) -> tuple[dict[str, list[ForgeIssue]], set[str]]:
        """The searched issues whose marker names a batch of the cycle, by that batch's repo
        (case-folded), and the batch repos named by issues found in another repo: those are
        listed under their own name, where the forge's redirect tells a rename (a copied
        marker in another repo proves nothing)."""
        repo_of = {b.batch_id: repo.casefold() for repo, group in batches.items() for b in group}
        found: dict[str, list[ForgeIssue]] = {}
        elsewhere: set[str] = set()
        for issue in issues:
            marked = read_marker(issue.body)
            repo = repo_of.get(marked[0]) if marked is not None else None
            if repo is None:
                continue  # a human's issue, or a batch this cycle does not poll
            if issue.repo and issue.repo.casefold() != repo:
                elsewhere.add(repo)
            else:
                found.setdefault(repo, []).append(issue)
        return found, elsewhere

    def _reconcile(
        self,
        batches: dict[str, list[BatchRecord]],
        counts: dict[str, int],
        counted_at: datetime | None,
    ) -> dict[str, Visit]:
        """The full cycle's visits: repos counting fewer open issues than the store holds
        open (the poller explains the difference), and repos with work of their own."""
        plan: dict[str, Visit] = {}
        for repo, repo_batches in batches.items():
            count = counts.get(repo.casefold(), 0)
            if count < self._expected(repo_batches, []) or any(map(self._own_work, repo_batches)):
                plan[repo] = Visit(full=True, open_count=(count, counted_at))
        return plan

    def _covered(self, repo: str, batches: list[BatchRecord], since: datetime | None) -> bool:
        """Whether the search's window holds every change since the repo was last seen."""
        if since is None:
            return False
        polled = [self._seen_since(b, since) for b in batches]
        seen = min(p for p in polled if p is not None) if None not in polled else None
        marks = [m for m in (seen, self.known.get(repo)) if m is not None]
        return bool(marks) and max(marks) >= since + SEARCH_OVERLAP

    def _seen_since(self, batch: BatchRecord, since: datetime | None) -> datetime | None:
        """Since when the service has seen every change of the batch's issues: its last
        poll; for a batch recorded since the previous plan read the batches (so its issues
        were made after that, and the previous search answered at most SEARCH_OVERLAP
        later), the start of this search's window: a burst of new batches is then seen by
        the search, not by one listing per repo. None: neither."""
        if batch.last_polled_at is not None:
            return batch.last_polled_at
        new = self.planned is not None and batch.batch_id not in self.planned
        if new and batch.intake_done and self.plan_seconds < SEARCH_OVERLAP.total_seconds():
            return None if since is None else since + SEARCH_OVERLAP
        return None

    def _since(self, batches: Iterable[list[BatchRecord]]) -> datetime | None:
        if self.searched_at is not None:
            return self.searched_at - SEARCH_OVERLAP
        polled = [b.last_polled_at for group in batches for b in group]
        if not polled or any(p is None for p in polled):
            return None
        return min(p for p in polled if p is not None) - SEARCH_OVERLAP

    def _own_work(self, batch: BatchRecord) -> bool:
        """A batch the cycle must visit whatever the search says."""
        overdue = batch.deadline is not None and batch.deadline <= utcnow()
        retrying = batch.next_attempt_at is not None and self.is_due(batch)
        return (
            self._seen_since(batch, None) is None
            or not batch.intake_done
            or batch.cancel_requested
            or overdue
            or retrying
            or batch.settling_tasks > 0
        )

    def _expected(self, batches: list[BatchRecord], issues: list[ForgeIssue]) -> int:
        """Open issues the repo should count once the search's closures are applied: from
        the batches' counters, tasks read only when the search showed closures."""
        closed = {i.number for i in issues if i.state == "closed"}
        if not closed:
            return sum(map(unsettled_of, batches))
        return sum(
            1
            for batch in batches
            for task in self.store.get_tasks(batch.batch_id)
            if task.status == TaskStatus.OPEN
            and task.settling is None
            and task.issue_number is not None
            and task.issue_number not in closed
        )
