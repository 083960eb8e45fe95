"""Intake: accept a parsed batch (record it with its hold), then open one issue per task.

Recording comes before any forge call, so a batch is never lost and never paid twice;
creation is never retried blindly: an interrupted intake adopts its own issues by marker
(markers.py) and creates only the rest, under a per-batch lease across processes.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextvars import copy_context
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from . import crashpoints
from .billing import Billing
from .callbacks import CallbackPolicy
from .config import Settings
from .errors import BatchRejected
from .forge import ForgeIssue, GiteaClient, UsesForge
from .inbox.parse import check_task_count, rejection_from_validation
from .lifecycle import Lifecycle, opened
from .markers import find_marked, issue_body
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
        lifecycle: Lifecycle,
    ) -> None:
        self.store = store
        self.billing = billing
        self._gitea = gitea
        self.settings = settings
        self.lifecycle = lifecycle
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
        mark_done: bool = True,
    ) -> dict[str, Any]:
        """Record a valid batch (or find its duplicate), then try once to open its issues;
        returns the receipt. A forge failure leaves the rest to the service's visits.

        `mark_done=False`: the caller hands the receipt over first and then calls `filed`,
        which stores that the intake is done in the same write (one write fewer before
        the client hears; a crash in between costs a visit that creates nothing).
        """
        with crashpoints.operation("intake"):
            return self._accept(batch, client_id, source, sha256, mark_done)

    def _accept(
        self,
        batch: BatchFile,
        client_id: str,
        source: str | None,
        sha256: str | None,
        mark_done: bool,
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
            if self._gitea is not None:  # without a forge, the service creates them later
                self.lifecycle.visit(
                    record.batch_id,
                    self._open,
                    record,
                    recorded.tasks,
                    bool(recorded.tasks),
                    mark_done,
                )
        finally:
            if keys is not None:
                keys.result()
        return self.receipt(record.batch_id, duplicate=recorded.duplicate)

    def filed(self, receipt: dict[str, Any]) -> None:
        """The drop sits beside its receipt: one write stores that, and that the intake is
        done when the receipt names every task's issue."""
        done = all(item["issue_number"] is not None for item in receipt["issues"])
        fields: dict[str, Any] = {"filed": True, "intake_done": True} if done else {"filed": True}
        self.store.update_batch(receipt["batch_id"], **fields)

    def receipt(self, batch_id: str, *, duplicate: bool = False) -> dict[str, Any]:
        """What the client is told: the batch id and each task's issue number so far."""
        batch = self.store.get_batch(batch_id)
        result: dict[str, Any] = {
            "ok": True,
            "batch_id": batch_id,
            "status": batch.status,
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

    def open_issues(self, batch_id: str) -> int:
        """Create the issues still missing for the batch; returns how many were created.

        Safe to call again after any interruption: a resumed intake first finds the issues
        an earlier attempt created (by their marker) and creates only the rest.
        """
        return self._open(self.store.get_batch(batch_id), [], False)

    def _open(
        self, batch: BatchRecord, tasks: list[TaskRecord], fresh: bool, mark_done: bool = True
    ) -> int:
        """`tasks` may be given to save reading them; `fresh` means the batch was recorded
        just now, so no earlier attempt can have created issues; `mark_done=False` leaves
        `intake_done` to `filed`."""
        if batch.intake_done or batch.status != BatchStatus.RUNNING or batch.cancel_requested:
            return 0
        with crashpoints.operation("intake"), self.store.intake_lease(batch.batch_id) as leased:
            if not leased:  # another process is creating this batch's issues right now
                return 0
            if not fresh:  # re-read: the lease holder before us may have stored progress
                batch, tasks = self.store.get_batch(batch.batch_id), []
                if batch.intake_done or batch.status != BatchStatus.RUNNING:
                    return 0
            tasks = tasks or self.store.get_tasks(batch.batch_id)
            return self._open_leased(batch, tasks, fresh, mark_done)

    def _open_leased(
        self, batch: BatchRecord, tasks: list[TaskRecord], fresh: bool, mark_done: bool
    ) -> int:
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
        if mark_done:
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
        workers = self.settings.intake_concurrency
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


def _own_unfiled(batch: BatchRecord, source: str | None, sha256: str | None) -> bool:
    """The same drop, read again after a crash stopped it before it was filed: the batch
    resumes; it is not a duplicate of itself."""
    return (
        source not in (None, API_SOURCE)
        and not batch.filed
        and batch.source == source
        and batch.sha256 == sha256
    )
