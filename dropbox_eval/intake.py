"""Intake: accept a parsed batch (record it with its hold), then open one issue per task.

Recording comes before any forge call, so a batch is never lost and never paid twice;
creation is never retried blindly: an interrupted intake adopts its own issues by marker
(markers.py) and creates only the rest, under a per-batch lease across processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextvars import copy_context
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from . import crashpoints
from .batchfile import check_task_count, rejection_from_validation
from .billing import Billing
from .callbacks import CallbackPolicy
from .config import Settings
from .errors import BatchRejected
from .forge import ForgeIssue, GiteaClient, UsesForge
from .markers import find_marked, issue_body, opened
from .models import (
    BatchFile,
    BatchRecord,
    BatchStatus,
    TaskRecord,
    TaskStatus,
    new_batch_id,
    utcnow,
    window_seconds,
)
from .names import refuse_reserved
from .scheduler import on_behalf_of
from .store import Store

log = logging.getLogger("dropbox_eval")
FLUSH_SECONDS = 5.0
API_SOURCE = "api"  # the `source` of batches posted to the HTTP API
LABEL_COLOR = "5319e7"


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
    ) -> None:
        self.store = store
        self.billing = billing
        self._gitea = gitea
        self.settings = settings
        # opens a batch's issues now, one visit under its stored schedule (app.py wires it)
        self.open_now: Callable[[str, list[TaskRecord] | None], object] | None = None
        self.policy = CallbackPolicy(settings.callback_allow)
        self._aside = ThreadPoolExecutor(max_workers=2, thread_name_prefix="intake-aside")

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
        if not recorded.duplicate:
            log.info(
                "batch %s: accepted %d tasks from %s (%s)",
                record.batch_id,
                record.total,
                client_id,
                source or API_SOURCE,
            )
        # the duplicate keys are written while the forge answers, not before its first call
        keys = None
        if recorded.tasks:
            keys = self._aside.submit(copy_context().run, self.store.write_keys, record)
        try:
            if open_now and self.open_now is not None:  # else the service opens it later
                self.open_now(record.batch_id, recorded.tasks or None)
        finally:
            if keys is not None:
                keys.result()
        return self.receipt(record.batch_id, duplicate=recorded.duplicate)

    def filed(self, receipt: dict[str, Any]) -> None:
        """The drop sits beside its receipt: one write stores that."""
        self.store.update_batch(receipt["batch_id"], filed=True)

    def receipt(self, batch_id: str, *, duplicate: bool = False) -> dict[str, Any]:
        """What the client is told: the batch id and each task's issue number so far."""
        batch = self.store.get_batch(batch_id)
        running = batch.status == BatchStatus.RUNNING
        result: dict[str, Any] = {
            "ok": True,
            "batch_id": batch_id,
            "status": "in_progress" if running else batch.status,
            "task_count": batch.total,
            "held": batch.cost if running else 0,
            "issues": [
                {"task_id": t.task_id, "issue_number": t.issue_number}
                for t in self.store.get_tasks(batch_id)
            ],
        }
        if batch.failure:
            result["failure"] = batch.failure
        if duplicate:
            result["duplicate"] = True
        return result

    def record(
        self,
        batch: BatchFile,
        client_id: str,
        *,
        source: str | None = None,
        sha256: str | None = None,
    ) -> Recorded:
        """Store the batch and its hold before any forge call. No forge I/O."""
        refuse_reserved(batch.client_id)  # names.py: the one rule, before the mismatch check
        refuse_reserved(client_id)
        if batch.client_id is not None and batch.client_id != client_id:
            raise BatchRejected(
                "client_mismatch",
                f"file claims client_id {batch.client_id!r} but was dropped for {client_id!r}",
                field="client_id",
            )
        check_task_count(len(batch.tasks), self.settings.max_tasks)
        if batch.callback_url:
            self.policy.check(batch.callback_url)
        with self.store.locked():
            existing = self.store.find_batch(client_id, sha256=sha256, batch_ref=batch.batch_ref)
            if existing:
                earlier = self.store.get_batch(existing)
                return Recorded(earlier, duplicate=not _own_unfiled(earlier, source, sha256))
            cost = self.billing.check_funded(client_id, len(batch.tasks))
            record = self._new_record(batch, client_id, cost, source, sha256)
            tasks = [
                TaskRecord(
                    task_id=t.task_id,
                    batch_id=record.batch_id,
                    repo=record.repo,
                    payload=t,
                    created_at=record.created_at,
                )
                for t in batch.tasks
            ]
            hold = self.billing.hold_entry(client_id, cost, record.batch_id)
            self.store.create_batch(record, tasks, hold)
        return Recorded(record, tasks)

    def _new_record(
        self, batch: BatchFile, client_id: str, cost: int, source: str | None, sha256: str | None
    ) -> BatchRecord:
        now = utcnow()
        batch_id = new_batch_id(now)
        return BatchRecord(
            batch_id=batch_id,
            client_id=client_id,
            batch_ref=batch.batch_ref,
            callback_url=batch.callback_url,
            repo=self.repo_for(client_id, batch_id),
            source=source,
            sha256=sha256,
            total=len(batch.tasks),
            cost=cost,
            unit_price=self.billing.task_price,
            created_at=now,
            deadline=now + timedelta(seconds=self._window(batch)),
        )

    def _window(self, batch: BatchFile) -> int:
        if batch.completion_window is None:
            return self.settings.completion_window
        seconds = window_seconds(batch.completion_window)
        low, high = 60, self.settings.max_completion_window
        if not low <= seconds <= high:
            raise BatchRejected(
                "invalid_batch",
                f"completion_window: must be between {low} and {high} seconds",
                field="completion_window",
            )
        return seconds

    def repo_for(self, client_id: str, batch_id: str) -> str:
        """The shared repo, or `<owner>/eval-<client_id>-<batch_id>`."""
        if self.settings.repo:
            return self.settings.repo
        return f"{self.settings.require_owner()}/eval-{client_id}-{batch_id}"

    def open_issues(self, batch_id: str, tasks: list[TaskRecord] | None = None) -> int:
        """Create the issues still missing for the batch; returns how many were created.
        `tasks`: the batch's tasks when the caller has just recorded them.

        Safe to call again after any interruption: `open_started` is stored on the record
        before the first forge write, and an attempt that finds it set first adopts the
        issues an earlier attempt created (by their marker) and creates only the rest.
        """
        batch = self.store.get_batch(batch_id)
        if not _wants_issues(batch):
            return 0
        with (
            crashpoints.operation("intake"),
            on_behalf_of(batch.client_id),
            self.store.intake_lease(batch.batch_id) as leased,
        ):
            if not leased:  # another process is creating this batch's issues right now
                return 0
            batch = self.store.get_batch(batch_id)  # the holder before us may have progressed
            if not _wants_issues(batch):
                return 0
            fresh = not batch.open_started
            if fresh:  # no attempt began: nothing to adopt, the given tasks are current
                batch = self.store.update_batch(batch_id, open_started=True)
            else:
                tasks = None
            return self._open_leased(batch, tasks or self.store.get_tasks(batch_id), fresh)

    def _open_leased(self, batch: BatchRecord, tasks: list[TaskRecord], fresh: bool) -> int:
        pending = [t for t in tasks if t.issue_number is None and t.status == TaskStatus.PENDING]
        created: dict[str, int] = {}
        if pending:  # reaching the end below means every pending task now has its issue
            gitea = self.gitea
            new_repo = fresh and not self.settings.repo  # named for this batch just now
            label_id = gitea.prepare_repo(
                batch.repo, self.settings.task_label, LABEL_COLOR, new=new_repo
            )
            if not fresh:  # an earlier attempt may have created some before it stopped
                found = find_marked(gitea, batch, pending, self.settings.task_label)
                self.store.update_tasks(
                    batch.batch_id, {k: opened(i.number, i.html_url) for k, i in found.items()}
                )
                pending = [t for t in pending if t.task_id not in found]
            created = self._create_all(batch, pending, label_id)
            log.info("batch %s: created %d issues in %s", batch.batch_id, len(created), batch.repo)
        self.store.update_batch(batch.batch_id, intake_done=True)
        return len(created)

    def _create_all(
        self, batch: BatchRecord, tasks: list[TaskRecord], label_id: int
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
            finally:
                for future in in_flight:
                    future.cancel()
                self.store.update_tasks(batch.batch_id, unsaved)
        return created


def _wants_issues(batch: BatchRecord) -> bool:
    return not (batch.intake_done or batch.status != BatchStatus.RUNNING or batch.cancel_requested)


def _own_unfiled(batch: BatchRecord, source: str | None, sha256: str | None) -> bool:
    """The same drop, read again after a crash stopped it before it was filed: the batch
    resumes; it is not a duplicate of itself."""
    return (
        source not in (None, API_SOURCE)
        and not batch.filed
        and batch.source == source
        and batch.sha256 == sha256
    )
