"""Opening a recorded batch's issues: one per task, under a per-batch lease across
processes. Creation is never retried blindly: an attempt that finds `open_started` on the
record adopts the issues an earlier attempt created (by their marker, markers.py) and
creates only the rest.

Adopting pages through the repo, which for a large batch is many round trips in a row. So
an attempt that a 429 or 503 stopped (answers that come before the forge does anything)
records every create it sent that landed, then marks the record `open_clean`: the next
attempt skips the listing, clearing the mark before its first create, so a kill during it
leaves a record that adopts again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextvars import copy_context
from typing import Any, NamedTuple

from ..config import Settings
from ..errors import ForgeError, ForgeRetryable
from ..forge.client import ForgeIssue, GiteaClient, UsesForge
from ..forge.markers import find_marked, issue_body, opened
from ..forge.scheduler import on_behalf_of
from ..models import BatchRecord, BatchStatus, TaskRecord, TaskSpec, TaskStatus
from ..store import Store
from ..util import crashpoints

log = logging.getLogger("dropbox_eval")
FLUSH_SECONDS = 5.0
LABEL_COLOR = "5319e7"
NOT_DONE = frozenset({429, 503})


class IssueOpener(UsesForge):
    """Creates the issues a recorded batch still lacks."""

    def __init__(
        self,
        store: Store,
        gitea: GiteaClient | None,
        settings: Settings,
        *,
        paused: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`paused`: when intake was paused (pause.py), or None: no issue is created while
        paused."""
        self.store = store
        self._gitea = gitea
        self.settings = settings
        self.paused = paused

    def open_issues(self, batch_id: str, tasks: list[TaskRecord] | None = None) -> int:
        """Create the issues still missing for the batch; returns how many were created.
        `tasks`: the batch's tasks when the caller has just recorded them.

        Safe to call again after any interruption: `open_started` is stored on the record
        before the first forge write, and an attempt that finds it set first adopts the
        issues an earlier attempt created (by their marker) and creates only the rest.
        """
        batch = self.store.get_batch(batch_id)
        if not _wants_issues(batch) or self.paused() is not None:
            return 0
        with (
            crashpoints.operation("intake"),
            on_behalf_of(batch.client_id),
            self.store.claim_issues(batch.batch_id) as leased,
        ):
            if not leased:  # another process is creating this batch's issues right now
                return 0
            batch = self.store.get_batch(batch_id)  # the holder before us may have progressed
            if not _wants_issues(batch):
                return 0
            fresh = not batch.open_started
            adopt = not (fresh or batch.open_clean)
            if fresh:  # no attempt began: nothing to adopt, the given tasks are current
                batch = self.store.update_batch(batch_id, open_started=True)
            else:  # cleared before any create: a kill from here on leaves one to adopt
                tasks = None
                if batch.open_clean:
                    batch = self.store.update_batch(batch_id, open_clean=False)
            pending = _unopened(tasks or self.store.get_tasks(batch_id))
            del tasks  # the opener holds only what it sends: see _unopened
            return self._open_leased(batch, pending, fresh, adopt)

    def _open_leased(
        self, batch: BatchRecord, pending: list[Unopened], fresh: bool, adopt: bool
    ) -> int:
        created: dict[str, int] = {}
        if pending:  # reaching the end below means every pending task now has its issue
            gitea = self.gitea
            new_repo = fresh and not self.settings.repo  # named for this batch just now
            label_id = gitea.prepare_repo(
                batch.repo, self.settings.task_label, LABEL_COLOR, new=new_repo
            )
            if adopt:  # an earlier attempt may have created some before it stopped
                found = find_marked(
                    gitea, batch, (t.task_id for t in pending), self.settings.task_label
                )
                self.store.update_tasks(
                    batch.batch_id, {k: opened(i.number, i.html_url) for k, i in found.items()}
                )
                pending = [t for t in pending if t.task_id not in found]
            created = self._create_all(batch, pending, label_id)
            log.info("batch %s: created %d issues in %s", batch.batch_id, len(created), batch.repo)
        self.store.update_batch(batch.batch_id, intake_done=True)
        return len(created)

    def _create_all(
        self, batch: BatchRecord, tasks: list[Unopened], label_id: int
    ) -> dict[str, int]:
        """Create issues with bounded concurrency and a bounded queue; progress is stored
        every few seconds (a crash in between is repaired by adoption, not by a flush)."""
        created: dict[str, int] = {}
        unsaved: dict[str, dict[str, Any]] = {}
        last_flush = time.monotonic()
        queue = iter(tasks)
        workers = self.settings.forge_max_inflight  # carriers: the scheduler sets the pace
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="intake") as pool:
            in_flight: dict[Future[ForgeIssue], str] = {}

            def submit_next() -> None:
                task = next(queue, None)
                if task is not None:
                    body = issue_body(batch.batch_id, task.payload)
                    future = pool.submit(
                        copy_context().run,  # the crash points count these writes too
                        self.gitea.create_issue,
                        batch.repo,
                        task.payload.title,
                        body,
                        [label_id],
                    )
                    in_flight[future] = task.task_id

            for _ in range(2 * workers):
                submit_next()
            try:
                while in_flight:
                    finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in finished:
                        task_id = in_flight.pop(future)
                        issue = future.result()  # the first failure stops the intake
                        created[task_id] = issue.number
                        unsaved[task_id] = opened(issue.number, issue.html_url)
                        submit_next()
                    if time.monotonic() - last_flush >= FLUSH_SECONDS:
                        self.store.update_tasks(batch.batch_id, unsaved)
                        unsaved, last_flush = {}, time.monotonic()
            except BaseException as error:  # creates already sent still land: record them
                landed_clean = self._record_landed(batch, in_flight, unsaved)
                if landed_clean and isinstance(error, ForgeError) and _not_done(error):
                    self.store.update_batch(batch.batch_id, open_clean=True)
                raise
            finally:
                self.store.update_tasks(batch.batch_id, unsaved)
        return created

    def _record_landed(
        self,
        batch: BatchRecord,
        in_flight: dict[Future[ForgeIssue], str],
        unsaved: dict[str, dict[str, Any]],
    ) -> bool:
        """Wait for the creates still out (those not started are cancelled) and record the
        ones that landed; True when every other one is known not to have been done."""
        for future in in_flight:
            future.cancel()
        clean = True
        for future in wait(in_flight).done:
            if future.cancelled():
                continue
            error = future.exception()
            if error is None:
                issue = future.result()
                unsaved[in_flight[future]] = opened(issue.number, issue.html_url)
            elif not (isinstance(error, ForgeError) and _not_done(error)):
                clean = False
        self.store.update_tasks(batch.batch_id, unsaved)
        unsaved.clear()
        return clean


class Unopened(NamedTuple):
    """A task whose issue is to be created: what the create sends, and no more."""

    task_id: str
    payload: TaskSpec


def _unopened(tasks: list[TaskRecord]) -> list[Unopened]:
    """The tasks without an issue yet. Not the task records: each is renewed in the store
    as its issue is recorded, and an opener holding the old ones through a 50,000-task
    intake held the batch twice (their specs are shared, so these cost a tuple each)."""
    return [
        Unopened(t.task_id, t.payload)
        for t in tasks
        if t.issue_number is None and t.status == TaskStatus.PENDING
    ]


def _not_done(error: ForgeError) -> bool:
    """An answer that comes before the forge acts (rate limit, unavailable): nothing made."""
    return isinstance(error, ForgeRetryable) and error.status in NOT_DONE


def _wants_issues(batch: BatchRecord) -> bool:
    return not (batch.intake_done or batch.status != BatchStatus.RUNNING or batch.cancel_requested)
