"""Retry: a `failed` or `expired` batch's failed and aborted tasks, again, as a new batch.

The new batch is an ordinary batch (its own id, hold, issues, report) linked both ways:
`retry_of` on it, `retried_by` on the batch it retries. Write order, all under the store's
lock (README "Crash safety"): the old record first gets `retried_by` (the new id, chosen
now: the reservation), then the new batch is stored as intake stores one (tasks, record,
then its index row with its hold, the commit). A kill after the reservation leaves a link
to a batch that does not exist yet: `retry` again creates it under that same id, so there
is never a second retry, and the link is never lost.

A re-drop of a failed or expired batch's file is refused with a hint to retry it
(`refuse_redrop`): the same bytes are the same batch, and a batch is retried on purpose.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import AlreadyRetried, BatchRejected, NotFoundError, NotRetryable
from ..models import BatchFile, BatchRecord, BatchStatus, TaskRecord, TaskStatus
from ..util import crashpoints

if TYPE_CHECKING:
    from .accept import Intake
    from .pause import Pause

log = logging.getLogger("dropbox_eval")
RETRYABLE = (BatchStatus.FAILED, BatchStatus.EXPIRED)
RETRIED_TASKS = frozenset(
    {TaskStatus.FAILED, TaskStatus.ABORTED, TaskStatus.EXPIRED, TaskStatus.MISSING}
)
"""The lane's `failed` verdicts and the tasks the batch's end cut short (`aborted` in a
failed batch, `expired` in an expired one, `missing`: the issue was deleted)."""
RETRY_SOURCE = "retry"  # the `source` of a retry's record


class Retries:
    """Opens the retry of a failed or expired batch."""

    def __init__(self, intake: Intake, pause: Pause) -> None:
        self.intake = intake
        self.store = intake.store
        self.pause = pause

    def retry(self, batch_id: str, *, client_id: str | None = None) -> dict[str, Any]:
        """Record the retry of `batch_id` with its hold, then (unless paused) try once to
        open its issues; returns its receipt with `retry_of`. `client_id`: the caller's
        client (another client's batch is unknown). Raises NotFoundError, NotRetryable,
        AlreadyRetried, or BatchRejected (`unfunded`, `callback_refused`)."""
        record, tasks = self._record(batch_id, client_id)
        log.info(
            "batch %s: retry of %s with %d tasks from %s",
            record.batch_id,
            batch_id,
            len(tasks),
            record.client_id,
        )
        if self.intake.open_now is not None and self.pause.since() is None:
            self.intake.open_now(record.batch_id, tasks)
        return self.intake.receipt(record.batch_id) | {"retry_of": batch_id}

    def _record(self, batch_id: str, client_id: str | None) -> tuple[BatchRecord, list[TaskRecord]]:
        spec = self._spec(self._retryable(batch_id, client_id))  # its callback checked unlocked
        with crashpoints.operation("retry"), self.store.transaction() as tx:
            old = self._retryable(batch_id, client_id)  # again: another process may have won
            try:
                cost = self.intake.billing.check_funded(old.client_id, len(spec.tasks))
            except BatchRejected as exc:
                if exc.reason != "unfunded":
                    raise
                message = exc.message.replace("drop the file again", "retry again")
                why = f"retry of {batch_id}: {message}"
                raise BatchRejected(exc.reason, why, **exc.details) from None
            new_id = old.retried_by
            record = self.intake.new_record(
                spec, old.client_id, cost, RETRY_SOURCE, None, batch_id=new_id, retry_of=batch_id
            )
            if new_id is None:  # the reservation: the link on the old record comes first
                tx.update_batch(batch_id, retried_by=record.batch_id)
            tasks = self.intake.create(record, spec, tx)
        return record, tasks

    def _retryable(self, batch_id: str, client_id: str | None) -> BatchRecord:
        """The batch, or a refusal: unknown (or another client's), a batch that did not end
        failed or expired, or one whose retry exists already (a reservation without its
        batch is resumed)."""
        old = self.store.get_batch(batch_id)
        if client_id is not None and old.client_id != client_id:
            raise NotFoundError(f"no batch {batch_id!r}")
        if old.retried_by is not None and self.store.is_recorded(old.retried_by):
            raise AlreadyRetried(
                f"batch {old.batch_id} was retried already, by batch {old.retried_by} "
                "(retry that one if it failed too)",
                retried_by=old.retried_by,
            )
        if old.status not in RETRYABLE:
            raise NotRetryable(
                f"batch {old.batch_id} is {old.status}; only a failed or expired batch can "
                "be retried",
                status=old.status,
            )
        return old

    def _spec(self, old: BatchRecord) -> BatchFile:
        """The retry as a batch file: the old batch's failed and aborted tasks, its callback
        and its completion window (within today's limits)."""
        tasks = [t.payload for t in self.store.get_tasks(old.batch_id) if t.status in RETRIED_TASKS]
        if not tasks:
            raise NotRetryable(
                f"batch {old.batch_id} has no failed, aborted, expired or missing task to retry",
                status=old.status,
            )
        if old.callback_url:
            self.intake.policy.check(old.callback_url)
        settings = self.intake.settings
        window = settings.completion_window
        if old.deadline is not None:
            window = int((old.deadline - old.created_at) / timedelta(seconds=1))
        window = max(60, min(window, settings.max_completion_window))
        return BatchFile(
            client_id=old.client_id,
            batch_ref=None,  # a ref names the first drop: the retry's duplicate is the retry
            callback_url=old.callback_url,
            completion_window=window,
            tasks=tasks,
            metadata=old.metadata,  # the same run's labels
        )


def refuse_redrop(earlier: BatchRecord) -> None:
    """A drop (or API body) that is an earlier batch which ended failed or expired: refused
    with the way on (`use_retry`), so the client is not told `duplicate` with nothing to do."""
    if earlier.status not in RETRYABLE:
        return
    then = f"; it was retried already, by batch {earlier.retried_by}" if earlier.retried_by else ""
    raise BatchRejected(
        "use_retry",
        f"this file is batch {earlier.batch_id}, which ended {earlier.status}{then}. To run "
        f"its failed and aborted tasks again, retry it: POST /api/eval/batches/"
        f"{earlier.batch_id}/retry (or ask the operator: dropbox-eval retry "
        f"{earlier.batch_id}); to start afresh, change its batch_ref or content",
        batch_id=earlier.batch_id,
        status=str(earlier.status),
        retried_by=earlier.retried_by,
    )
