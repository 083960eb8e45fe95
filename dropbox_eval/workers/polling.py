"""ForgeWorker: cancel and expiry, handing unopened batches to the opener, and polling,
repo by repo in parallel; a cycle every poll interval, and a visit at once of each repo a
webhook or a settle alarm names."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ForgeError, StorageUnavailable
from ..forge.scheduler import on_behalf_of
from ..models import BatchStatus
from ..results.scout import ChangeScout, Visit
from ..store.nodes import leased
from ..util.keyedpool import KeyedPool
from .guard import POOL_SIZE, TICK_SECONDS, Report, guarded

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

    from ..config import Settings
    from ..forge.client import GiteaClient
    from ..lifecycle.ending import Lifecycle
    from ..ops.metrics import Metrics
    from ..results.poller import Poller
    from ..results.webhooks import Nudges
    from ..store import Store
    from ..store.nodes import Node
    from .opening import OpenWorker

log = logging.getLogger("dropbox_eval")


@dataclass(frozen=True)
class PollingStages:
    """What a forge cycle uses: the stages it drives and what it tells."""

    settings: Settings
    store: Store
    gitea: GiteaClient | None
    lifecycle: Lifecycle
    poller: Poller
    nudges: Nudges
    metrics: Metrics
    node: Node  # a repo is polled under this node's `poll` lease


class ForgeWorker:
    """Cancel/expire, resumed intakes and polling, repo by repo in parallel."""

    def __init__(
        self,
        stages: PollingStages,
        stop: threading.Event,
        report: Report,
        opener: OpenWorker,
        *,
        on_full: Callable[[], None] | None = None,
        on_cycle: Callable[[int], None] = lambda _cycles: None,
        now: threading.Event | None = None,
    ) -> None:
        """`opener` takes unopened batches; `on_full` runs before each full reconciliation
        (the state check); `on_cycle` is told the count after each full cycle (the status);
        `now`, set, starts the next cycle at once (a resume)."""
        self.settings = stages.settings
        self.store = stages.store
        self.lifecycle = stages.lifecycle
        self.poller = stages.poller
        self.nudges = stages.nudges
        self.metrics = stages.metrics
        self.node = stages.node
        self.stop = stop
        self.report = report
        self.opener = opener
        self.on_full = on_full
        self.on_cycle = on_cycle
        self.cycles = 0
        self.now = now or threading.Event()
        self.pool = KeyedPool(POOL_SIZE, "forge")  # a repo that hangs holds its own visit
        # one repo per batch: a cross-repo search finds the repos that changed
        self.scout = None
        if not self.settings.repo:
            self.scout = ChangeScout(
                stages.store, stages.gitea, stages.settings, stages.lifecycle.attempts.is_due
            )

    def run(self) -> None:
        """A cycle every poll interval until stopped; repos a webhook named at once."""
        nudges = self.nudges
        next_cycle = time.monotonic()
        while not self.stop.is_set():
            if time.monotonic() >= next_cycle or self.now.is_set():
                self.now.clear()
                guarded("poll cycle", self.report, self.cycle)
                self.on_cycle(self.cycles)
                next_cycle = time.monotonic() + self.settings.poll_interval
            else:
                guarded("webhook poll", self.report, self.cycle, nudges.take())
            nudges.wake.wait(min(TICK_SECONDS, max(0.0, next_cycle - time.monotonic())))
            nudges.wake.clear()

    def waiting(self) -> None:
        """The forge's outages are the batches' retries, not the worker's state."""

    def close(self) -> None:
        """Let the repo visits under way finish (after the last run)."""
        self.pool.shutdown(wait=True)

    def cycle(self, only: set[str] | None = None) -> list[Future[Any]]:
        """Visit every due running batch (of the repos `only` names, for a webhook's nudge:
        an incremental poll outside the cycle); returns the repo visits started."""
        if only is not None and not only:
            return []
        begun = time.monotonic()
        full = False
        if only is None:
            self.cycles += 1
            full = (self.cycles - 1) % self.settings.full_poll_every == 0
            if full and self.cycles > 1 and self.on_full is not None:  # the start ran it
                guarded("state check", self.report, self.on_full)
        by_repo: dict[str, list[str]] = {}
        clients: dict[str, str] = {}  # whose queue a repo's visit waits in at the forge
        for row in self.store.list_batches(live_only=True, status=BatchStatus.RUNNING):
            if self.stop.is_set():
                continue
            if only is not None and row.repo.casefold() not in only:
                continue
            by_repo.setdefault(row.repo, []).append(row.batch_id)
            clients.setdefault(row.repo, row.client_id)
        plan: dict[str, Visit] | None = None
        if only is None and self.scout is not None and len(by_repo) > 1:  # else one listing
            plan = self._scouted(by_repo, full)  # {} when nothing needs a visit
        if plan is None:
            plan = {repo: Visit(full=full) for repo in by_repo}
        started = []
        for repo, visit in plan.items():
            future = self.pool.submit(
                [repo], self._visit_repo, repo, by_repo[repo], visit, clients[repo]
            )
            if future is not None:
                started.append(future)
            elif only is not None:  # a webhook's news waits for the visit in flight
                self.nudges.add(repo, wake=False)
        if only is None:  # a poll cycle, not a webhook's nudge
            self.metrics.time_cycle(started, begun)
        return started

    def _scouted(self, by_repo: dict[str, list[str]], full: bool) -> dict[str, Visit] | None:
        """The search's plan; None (every repo listed) when the search failed."""
        assert self.scout is not None
        try:
            return self.scout.plan(by_repo, full)
        except ForgeError as exc:
            log.warning("cross-repo search failed, listing every repo: %s", exc)
            self.report("search", exc)
            return None

    def _visit_repo(self, repo: str, batch_ids: list[str], visit: Visit, client: str) -> None:
        with on_behalf_of(client):
            guarded(f"repo {repo}", self.report, self._leased_visit, repo, batch_ids, visit)

    def _leased_visit(self, repo: str, batch_ids: list[str], visit: Visit) -> None:
        """Visit the repo unless another node is polling it (it records what it reads)."""
        with leased(self.node, "poll", repo.casefold()) as mine:
            if mine:
                self.visit_repo(batch_ids, visit)

    def visit_repo(self, batch_ids: list[str], visit: Visit) -> None:
        """End or resume each due batch of one repo, then poll the rest in one listing."""
        lifecycle, store = self.lifecycle, self.store
        to_poll: list[str] = []
        failing: list[str] = []  # batches whose earlier visits failed: reset once this works
        for batch_id in batch_ids:
            batch = store.get_batch(batch_id)
            try:
                if lifecycle.end_if_due(batch_id, batch):
                    continue
            except StorageUnavailable as exc:  # it waits (lifecycle.visit); the others go on
                log.warning("batch %s: not ended yet: %s", batch_id, exc)
                continue
            if batch.status != BatchStatus.RUNNING or not lifecycle.attempts.is_due(batch):
                continue
            if not batch.intake_done:  # the opener creates what is missing; the issues
                self.opener.offer(batch_id, batch.client_id)  # it has are polled meanwhile
            to_poll.append(batch_id)
            # a listing that works says nothing of an opening that keeps failing: only the
            # opener's own success forgets its failures
            if batch.intake_done and (batch.attempts or batch.next_attempt_at is not None):
                failing.append(batch_id)
        if not to_poll:
            return
        try:
            self.poller.poll_batches(
                to_poll,
                full=visit.full,
                probe=visit.probe,
                listed=visit.listed,
                open_count=visit.open_count,
            )
        except ForgeError as exc:
            for batch_id in to_poll:  # the listing is shared: each batch counts the visit
                lifecycle.visit(batch_id, _raise, exc)
        except StorageUnavailable:  # its results could not be stored: each batch waits
            for batch_id in to_poll:
                lifecycle.attempts.storage_refused(batch_id)
            raise
        else:  # no batch read again when none had failed (the common, idle case)
            for batch_id in failing:
                lifecycle.attempts.succeeded(store.get_batch(batch_id))


def _raise(error: Exception) -> None:
    raise error
