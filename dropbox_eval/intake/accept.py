"""Intake: accept a parsed batch: record it with its hold, before any forge call, so a
batch is never lost and never paid twice; its receipt follows at once. Its issues are
opened by issues.py (`open_issues`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from ..billing.accounts import Billing
from ..config import Settings
from ..errors import BatchRejected
from ..forge.client import GiteaClient, UsesForge
from ..models import (
    BATCH_WIDE_TASK_FIELDS,
    BatchFile,
    BatchRecord,
    BatchStatus,
    LedgerEntry,
    TaskRecord,
    new_batch_id,
    utcnow,
)
from ..protocol.batchfile import check_claims, rejection_from_validation, window_of
from ..protocol.callbacks import CallbackPolicy
from ..protocol.documents import Acceptance, issue_list
from ..store import Store, Transaction
from ..util import crashpoints
from ..util.compact import compacted
from .opening import IssueOpener
from .resubmit import refuse_redrop

log = logging.getLogger("dropbox_eval")
API_SOURCE = "api"  # the `source` of batches posted to the HTTP API


@dataclass
class Recorded:
    """A stored batch: new (with its tasks), resumed after a crash, or a duplicate."""

    batch: BatchRecord
    tasks: list[TaskRecord] = field(default_factory=list)
    duplicate: bool = False


class Intake(UsesForge):
    """Records batches and opens their issues."""

    def __init__(
        self,
        store: Store,
        billing: Billing,
        gitea: GiteaClient | None,
        settings: Settings,
        *,
        opener: IssueOpener | None = None,
        open_now: Callable[[str, list[TaskRecord] | None], object] | None = None,
    ) -> None:
        """`opener` creates a batch's issues; `open_now` opens them at once, as one visit
        under the batch's stored schedule (None: the service opens them later)."""
        self.store = store
        self.billing = billing
        self._gitea = gitea
        self.settings = settings
        self.opener = opener or IssueOpener(store, gitea, settings)
        self.open_now = open_now
        self.open_issues = self.opener.open_issues
        self.policy = CallbackPolicy(settings.callback_allow)

    def submit_batch(
        self,
        client_id: str,
        tasks: list[dict[str, Any]],
        callback_url: str | None = None,
        batch_ref: str | None = None,
    ) -> dict[str, Any]:
        """The seed's API: validate, check funds, open issues; a rejection comes back as
        `{"ok": False, "reason": ...}` (every other operation raises)."""
        try:
            batch = BatchFile.model_validate(
                {
                    "client_id": client_id,
                    "tasks": tasks,
                    "callback_url": callback_url,
                    "batch_ref": batch_ref,
                }
            )
            return self.accept(batch, client_id)
        except ValidationError as exc:
            return rejection_from_validation(exc).as_dict()
        except BatchRejected as exc:
            return exc.as_dict()

    def accept(
        self,
        batch: BatchFile,
        client_id: str,
        *,
        source: str | None = None,
        sha256: str | None = None,
        open_now: bool = True,
    ) -> dict[str, Any]:
        """Record a valid batch (or find its duplicate), then, with `open_now`, try once to
        open its issues; returns the receipt. A forge failure leaves the rest to the
        service's visits.

        Without `open_now` (a drop), nothing waits for the forge: the receipt says
        `in_progress` as soon as the batch and its hold are durable, and the caller hands
        the batch to whoever opens its issues once the drop is filed (`filed`).
        """
        with crashpoints.operation("intake"):
            return self._accept(batch, client_id, source, sha256, open_now)

    def _accept(
        self,
        batch: BatchFile,
        client_id: str,
        source: str | None,
        sha256: str | None,
        open_now: bool,
    ) -> dict[str, Any]:
        recorded = self.record(batch, client_id, source=source, sha256=sha256)
        record = recorded.batch
        if recorded.tasks:  # recorded just now (a found batch comes without its tasks)
            log.info(
                "batch %s: accepted %d tasks from %s (%s)",
                record.batch_id,
                record.total,
                client_id,
                source or API_SOURCE,
            )
        elif not recorded.duplicate:  # its drop read again: the last look did not file it
            log.info("batch %s: recorded before from %s; filing it", record.batch_id, source)
        if open_now and self.open_now is not None:  # else the service opens it later
            self.open_now(record.batch_id, recorded.tasks or None)
            return self.receipt(record.batch_id, duplicate=recorded.duplicate)
        return self.receipt(record.batch_id, duplicate=recorded.duplicate, known=recorded)

    def filed(self, receipt: dict[str, Any]) -> None:
        """The drop sits beside its receipt: one write stores that."""
        self.store.update_batch(receipt["batch_id"], filed=True)

    def receipt(
        self, batch_id: str, *, duplicate: bool = False, known: Recorded | None = None
    ) -> dict[str, Any]:
        """What the client is told: the batch id and each task's issue number so far.
        `known`: a batch recorded just now and not opened, as recorded (nothing read)."""
        fresh = known is not None and bool(known.tasks)
        batch = known.batch if known is not None and fresh else self.store.get_batch(batch_id)
        running = batch.status == BatchStatus.RUNNING
        numbers = (
            {task.task_id: task.issue_number for task in known.tasks}
            if known is not None and fresh
            else self.store.issue_numbers(batch_id)
        )
        return Acceptance.with_issues(
            issue_list(numbers),
            ok=True,
            batch_id=batch_id,
            status="in_progress" if running else batch.status,
            task_count=batch.total,
            held=batch.cost if running else 0,
            failure=batch.failure,
            duplicate=duplicate,
            metadata=batch.metadata,
        ).document()

    def record(
        self,
        batch: BatchFile,
        client_id: str,
        *,
        source: str | None = None,
        sha256: str | None = None,
    ) -> Recorded:
        """Store the batch and its hold before any forge call. No forge I/O."""
        check_claims(batch, client_id, self.settings.max_tasks)
        if batch.callback_url:
            self.policy.check(batch.callback_url)
        with self.store.arriving():  # the group commit may wait for this one
            return self._record(batch, client_id, source, sha256)

    def _record(
        self, batch: BatchFile, client_id: str, source: str | None, sha256: str | None
    ) -> Recorded:
        found = self._earlier(batch, client_id, source, sha256)  # a first look, unlocked
        if found is not None:  # a batch is never unrecorded: nothing to stage
            return found
        cost = self.billing.check_funded(client_id, len(batch.tasks))  # before any write
        record = self.new_record(batch, client_id, cost, source, sha256)
        tasks = self.task_records(record, batch)

        def decide() -> LedgerEntry | None:  # under the store lock, in the group commit
            found = self._earlier(batch, client_id, source, sha256)
            if found is not None:  # not recorded
                raise _Found(found)
            self.billing.check_funded(client_id, len(batch.tasks))  # again, under the lock
            return self.billing.hold_entry(client_id, cost, record.batch_id)

        try:
            self.store.commit_new(record, tasks, decide)
        except _Found as earlier:
            return earlier.recorded
        return Recorded(record, tasks)

    def _earlier(
        self, batch: BatchFile, client_id: str, source: str | None, sha256: str | None
    ) -> Recorded | None:
        """The batch this drop already is (a duplicate, or itself resumed after a crash),
        a refusal of a re-drop, or None. Without the store lock it may miss a batch being
        committed right now: only a look under the lock may say None for sure."""
        existing = self.store.find_batch(client_id, sha256=sha256, batch_ref=batch.batch_ref)
        if not existing:
            return None
        earlier = self.store.get_batch(existing)
        if _own_unfiled(earlier, source, sha256):
            return Recorded(earlier)
        refuse_redrop(earlier)  # a failed or expired batch: `retry` is the way
        return Recorded(earlier, duplicate=True)

    def create(self, record: BatchRecord, batch: BatchFile, tx: Transaction) -> list[TaskRecord]:
        """Record a new batch with its tasks and its hold in `tx`; returns its tasks."""
        tasks = self.task_records(record, batch)
        hold = self.billing.hold_entry(record.client_id, record.cost, record.batch_id)
        tx.record_batch(record, tasks, hold)
        return tasks

    @staticmethod
    def task_records(record: BatchRecord, batch: BatchFile) -> list[TaskRecord]:
        """The new batch's tasks, as stored (compact: a big batch's are many)."""
        memo: dict[Any, Any] = {}
        return [
            compacted(
                TaskRecord(
                    task_id=t.task_id,
                    batch_id=record.batch_id,
                    repo=record.repo,
                    payload=t,
                    created_at=record.created_at,
                ),
                memo,
                BATCH_WIDE_TASK_FIELDS,
            )
            for t in batch.tasks
        ]

    def new_record(
        self,
        batch: BatchFile,
        client_id: str,
        cost: int,
        source: str | None,
        sha256: str | None,
        *,
        batch_id: str | None = None,
        retry_of: str | None = None,
    ) -> BatchRecord:
        """The record of a new batch (not stored); `batch_id` when it was chosen before
        (a retry names its batch on the batch it retries first)."""
        now = utcnow()
        batch_id = batch_id or new_batch_id(now)
        return BatchRecord(
            batch_id=batch_id,
            retry_of=retry_of,
            client_id=client_id,
            batch_ref=batch.batch_ref,
            callback_url=batch.callback_url,
            metadata=batch.metadata,
            repo=self.repo_for(client_id, batch_id),
            source=source,
            sha256=sha256,
            total=len(batch.tasks),
            cost=cost,
            unit_price=self.billing.task_price,
            created_at=now,
            deadline=now
            + timedelta(
                seconds=window_of(
                    batch, self.settings.completion_window, self.settings.max_completion_window
                )
            ),
        )

    def repo_for(self, client_id: str, batch_id: str) -> str:
        """The shared repo, or `<owner>/eval-<client_id>-<batch_id>`."""
        if self.settings.repo:
            return self.settings.repo
        return f"{self.settings.require_owner()}/eval-{client_id}-{batch_id}"


class _Found(Exception):
    """The drop is a batch recorded before (a duplicate, or itself read again)."""

    def __init__(self, recorded: Recorded) -> None:
        super().__init__(recorded.batch.batch_id)
        self.recorded = recorded


def _own_unfiled(batch: BatchRecord, source: str | None, sha256: str | None) -> bool:
    """The same drop, read again after a crash stopped it before it was filed: the batch
    resumes; it is not a duplicate of itself."""
    return (
        source not in (None, API_SOURCE)
        and not batch.filed
        and batch.source == source
        and batch.sha256 == sha256
    )
