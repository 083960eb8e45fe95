"""Lifecycle: cancel, expire and fail running batches (close open issues, then settle).

Every batch ends: a cancel request, the deadline or a failure that retrying cannot fix
ends it, whatever the forge answers. Closing an issue that is gone (404 on Forgejo, 500 on
Gitea, confirmed by a GET) finishes its task as `missing`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ..config import Settings
from ..errors import (
    Busy,
    ForgeError,
    ForgeNotFound,
    ForgePermanent,
    ForgeRetryable,
    NotRunning,
    StorageUnavailable,
)
from ..forge.client import GiteaClient, UsesForge
from ..forge.markers import find_marked, opened
from ..forge.scheduler import on_behalf_of
from ..models import BatchRecord, BatchStatus, TaskStatus, utcnow
from ..ports import Closing, PollingOne, ReadingNow
from ..results.reading import ended, settled
from ..store import Store
from ..util import crashpoints
from .attempts import Attempts

log = logging.getLogger("dropbox_eval")
LEASE_WAIT_SECONDS = 120.0
WHY = {
    BatchStatus.CANCELLED: "Cancelled by the client before the lane finished this task.",
    BatchStatus.EXPIRED: "The batch passed its completion window before the lane finished "
    "this task.",
    BatchStatus.FAILED: "The batch failed before the lane finished this task: {failure}",
}
ABORTED_TASK = {
    BatchStatus.CANCELLED: TaskStatus.CANCELLED,
    BatchStatus.EXPIRED: TaskStatus.EXPIRED,
    BatchStatus.FAILED: TaskStatus.ABORTED,
}
T = TypeVar("T")


class Lifecycle(UsesForge):
    """Ends running batches early, and runs forge work under the durable schedule."""

    def __init__(
        self,
        store: Store,
        gitea: GiteaClient | None,
        settings: Settings,
        poll_completed: PollingOne,
        read_now: ReadingNow,
        close: Closing,
        attempts: Attempts,
        *,
        paused: Callable[[], str | None] = lambda: None,
        on_error: Callable[[str, Exception], None] | None = None,
    ) -> None:
        """`poll_completed` keeps what the lane finished before issues are closed;
        `read_now` reads a settling result as it stands; `close` closes a batch; `paused`:
        when forge writes were paused (pause.py), or None (cancels and deadlines wait
        meanwhile); `on_error` is told of a failed visit (the service's status)."""
        self.store = store
        self._gitea = gitea
        self.settings = settings
        self.poll_completed = poll_completed
        self.read_now = read_now
        self.close = close
        self.attempts = attempts
        self.on_error = on_error
        self.paused = paused

    def visit(self, batch_id: str, step: Callable[..., T], *args: Any) -> T | None:
        """Run one try of forge work for a batch; a failure is stored on the batch, and a
        permanent or endlessly repeated one ends it `failed`. None when the step failed."""
        try:  # storing the outcome can meet the full disk too: the next visit waits then
            return self._visit(batch_id, step, *args)
        except StorageUnavailable:
            self.attempts.storage_refused(batch_id)
            raise

    def _visit(self, batch_id: str, step: Callable[..., T], *args: Any) -> T | None:
        try:
            result = step(*args)
        except ForgeError as exc:
            log.warning("batch %s: forge error, next visit later: %s", batch_id, exc)
            if self.on_error is not None:
                self.on_error(f"batch {batch_id}", exc)
            if self.paused() is not None:  # forge maintenance: not the batch's failure
                return None
            failure = self.attempts.failed(batch_id, exc)
            if failure is not None:
                self.fail(batch_id, failure)
            return None
        self.attempts.succeeded(self.store.get_batch(batch_id))
        return result

    def cancel(self, batch_id: str) -> BatchRecord:
        """Cancel a running batch: its open issues get a comment, `eval-cancelled` and are
        closed; finished results are kept. The request is stored first, so a forge failure
        half-way is finished by a later visit."""
        batch = self.store.get_batch(batch_id)
        if batch.status != BatchStatus.RUNNING:
            raise NotRunning(
                f"batch {batch_id} is {batch.status}; only running batches can be cancelled",
                status=batch.status,
            )
        # The request on the record first: a kill after it is finished by the next visit
        # (end_if_due), which closes the issues still open and then settles.
        with crashpoints.operation("cancel"), on_behalf_of(batch.client_id):
            if not batch.cancel_requested:
                self.store.update_batch(batch_id, cancel_requested=True)
            if self._gitea is None or self.paused() is not None:  # the service finishes it
                return self.store.get_batch(batch_id)
            return self._abort(batch_id, BatchStatus.CANCELLED)

    def end_if_due(self, batch_id: str, batch: BatchRecord | None = None) -> bool:
        """Finish a pending cancel or expire a batch past its deadline; True if it ended.
        The deadline always wins: past it, the batch ends even if the forge is down.
        `batch`: its record, when the caller has just read it."""
        batch = batch or self.store.get_batch(batch_id)
        if batch.status != BatchStatus.RUNNING or self.paused() is not None:
            return False
        overdue = batch.deadline is not None and batch.deadline <= utcnow()
        if not self.attempts.storage_waits.ready(batch_id):  # storage refused its last try
            return False
        if batch.cancel_requested and (overdue or self.attempts.is_due(batch)):
            status = BatchStatus.CANCELLED
        elif overdue:
            status = BatchStatus.EXPIRED
        else:
            return False
        # Issues closed one by one (each task's end journalled), then settle: a kill
        # between them is finished by the next visit, which sees the same deadline.
        operation = "cancel" if status == BatchStatus.CANCELLED else "expire"
        with crashpoints.operation(operation), on_behalf_of(batch.client_id):
            if self.visit(batch_id, self._abort, batch_id, status) is None and overdue:
                self._end_locally(batch_id, status)
        return True

    def fail(self, batch_id: str, failure: str) -> BatchRecord:
        """End a batch `failed`: one try to close its open issues, then settle (nothing is
        charged for unfinished work) with the reason in the report."""
        try:
            return self._abort(batch_id, BatchStatus.FAILED, failure=failure)
        except (ForgeError, Busy) as exc:
            log.warning("batch %s: open issues not closed (%s)", batch_id, exc)
            return self._end_locally(batch_id, BatchStatus.FAILED, failure=failure)

    def _abort(self, batch_id: str, status: BatchStatus, failure: str | None = None) -> BatchRecord:
        with self.store.claim_issues(batch_id, wait=LEASE_WAIT_SECONDS) as leased:
            if not leased:
                raise Busy(
                    f"batch {batch_id} is busy (its issues are being created); try "
                    "again in a minute"
                )
            try:
                self._close_open_issues(batch_id, status, failure)
            except ForgeNotFound:  # the repo is gone: nothing is left to close on the forge
                log.warning(
                    "batch %s: repo not found; unfinished tasks end as %s", batch_id, status
                )
            return self._end_locally(batch_id, status, failure=failure)

    def _end_locally(
        self, batch_id: str, status: BatchStatus, failure: str | None = None
    ) -> BatchRecord:
        why = WHY[status].format(failure=failure)
        change = ended(ABORTED_TASK[status], why)
        # one transaction from the tasks' end to the batch's: a poll that read them all
        # finished in between would close the batch `completed` first (the close is once)
        with self.store.transaction() as tx:
            tasks = tx.get_tasks(batch_id)
            tx.update_tasks(  # a task the lane closed keeps the result read so far
                batch_id,
                {
                    t.task_id: settled(t.settling) if t.settling else change
                    for t in tasks
                    if not t.status.is_finished
                },
            )
            return self.close(batch_id, tx.get_tasks(batch_id), status, failure=failure)

    def _close_open_issues(self, batch_id: str, status: BatchStatus, failure: str | None) -> None:
        """Keep what the lane finished, then comment, label and close every open issue."""
        if status != BatchStatus.FAILED:
            self.poll_completed(batch_id)
        batch = self.store.get_batch(batch_id)
        if batch.status != BatchStatus.RUNNING:
            return
        tasks = self.store.get_tasks(batch_id)
        pending = [t for t in tasks if t.status == TaskStatus.PENDING]
        if pending:  # two labels of one name would hide every issue from the adoption
            self.gitea.repair_label(batch.repo, self.settings.task_label)
            found = find_marked(
                self.gitea, batch, (t.task_id for t in pending), self.settings.task_label
            )
            self.store.update_tasks(
                batch_id, {k: opened(i.number, i.html_url) for k, i in found.items()}
            )
            tasks = self.store.get_tasks(batch_id)
        open_tasks = [t for t in tasks if t.status == TaskStatus.OPEN and t.issue_number]
        closed_by_lane = {  # the lane closed them: their results as they stand now
            t.task_id: self.read_now(batch.repo, t) for t in open_tasks if t.settling
        }
        self.store.update_tasks(batch_id, closed_by_lane)  # their issues are closed already
        open_tasks = [t for t in open_tasks if "status" not in closed_by_lane.get(t.task_id, {})]
        if not open_tasks:
            return
        label_id = self.gitea.ensure_label(batch.repo, f"eval-{status}", "cccccc")
        why = WHY[status].format(failure=failure)
        closed: dict[str, dict[str, Any]] = {}
        try:
            for task in open_tasks:
                try:
                    gone = self._close_issue(batch.repo, task.issue_number or 0, label_id, why)
                except ForgeError as exc:
                    if status != BatchStatus.FAILED:
                        raise  # cancel and expiry try again at the next visit
                    log.warning(
                        "batch %s: issue #%s left open: %s", batch_id, task.issue_number, exc
                    )  # failing: one try for each issue
                    gone = False
                closed[task.task_id] = (
                    ended(TaskStatus.MISSING, "the issue was deleted")
                    if gone
                    else ended(ABORTED_TASK[status], why)
                )
        finally:
            self.store.update_tasks(batch_id, closed)

    def _close_issue(self, repo: str, number: int, label_id: int, why: str) -> bool:
        """Comment, label and close; True when the issue turned out to be gone. The comment
        and the label are a courtesy: a forge refusing them does not keep the issue open."""
        try:
            courtesies: list[Callable[[], None]] = [
                lambda: self.gitea.comment(repo, number, why),
                lambda: self.gitea.add_labels(repo, number, [label_id]),
            ]
            for courtesy in courtesies:
                try:
                    courtesy()
                except ForgePermanent as exc:
                    if isinstance(exc, ForgeNotFound):
                        raise
                    log.warning("%s#%d: %s", repo, number, exc)
            self.gitea.close_issue(repo, number)
        except ForgeNotFound:
            return True
        except ForgeRetryable as exc:
            if exc.status != 500:
                raise
            try:  # Gitea answers 500 to a comment on a deleted issue: ask for the issue
                self.gitea.get_issue(repo, number)
            except ForgeNotFound:
                return True
            raise
        return False
