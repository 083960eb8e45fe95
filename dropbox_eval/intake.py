"""EvalIntake: batch -> one forge issue per task -> lane results -> report (the seed's API)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from .billing import LANE_FINISHED, Billing
from .callbacks import CallbackPolicy
from .config import Settings
from .emitter import Emitter
from .errors import (
    BatchRejected,
    DeliveryError,
    DropboxEvalError,
    ForgeError,
    ForgeNotFound,
)
from .forge import ForgeIssue, GiteaClient
from .models import (
    FINISHED_TASK_STATUSES,
    BatchFile,
    BatchRecord,
    TaskRecord,
    TaskResult,
    TaskSpec,
    new_batch_id,
    utcnow,
    window_seconds,
)
from .report import build_report, read_result

log = logging.getLogger("dropbox_eval")

LEASE_WAIT_SECONDS = 120.0
MARKER_RE = re.compile(r"<!-- dropbox-eval:task batch=([A-Za-z0-9._-]+) task=([A-Za-z0-9._-]+) -->")
# `since` is taken from the forge's own clock (the Date of the previous listing), so one
# second covers its whole-second precision; our clock is used only without a Date header.
SINCE_OVERLAP = timedelta(seconds=1)
LOCAL_CLOCK_MARGIN = timedelta(minutes=2)
ADOPT_MARGIN = timedelta(hours=1)  # finding an interrupted intake's issues tolerates skew
FLUSH_SECONDS = 5.0
MAX_DELIVERY_DELAY = 6 * 3600.0
LABEL_COLOR = "5319e7"


def marker(batch_id: str, task_id: str) -> str:
    """The invisible fingerprint that makes issue creation idempotent."""
    return f"<!-- dropbox-eval:task batch={batch_id} task={task_id} -->"


def neutralised(text: str) -> str:
    """Client text with HTML comments made visible (`<!--` -> `&lt;!--`), so a task cannot
    carry a marker, or hide anything from the people reading the issue."""
    return text.replace("<!--", "&lt;!--")


def issue_body(batch_id: str, task: TaskSpec) -> str:
    """Task spec + acceptance + `batch:` line + marker, which is always the last line."""
    body = neutralised(task.body.strip())
    parts = [body] if body else []
    if task.acceptance:
        parts.append("## Acceptance\n" + "\n".join(f"- [ ] {neutralised(item)}"
                                                   for item in task.acceptance))
    parts.append(f"batch: {batch_id}\ntask: {task.task_id}")
    parts.append(marker(batch_id, task.task_id))
    return "\n\n".join(parts) + "\n"


def read_marker(body: str) -> tuple[str, str] | None:
    """(batch_id, task_id) of the marker the service wrote: the body's last line, exactly.
    A marker anywhere else is client text and does not count."""
    lines = body.rstrip().splitlines()
    match = MARKER_RE.fullmatch(lines[-1].strip()) if lines else None
    return (match.group(1), match.group(2)) if match else None


class EvalIntake:
    """The seed's API: submit_batch, poll_completed, emit."""

    def __init__(
        self, core: Billing, gitea: GiteaClient | None, emitter: Emitter, settings: Settings
    ) -> None:
        self.core = core
        self.store = core.store
        self._gitea = gitea
        self.emitter = emitter
        self.settings = settings
        self.policy = CallbackPolicy(settings.callback_allow)

    @property
    def gitea(self) -> GiteaClient:
        """The forge client; a ConfigError names the missing setting when there is none."""
        if self._gitea is None:
            self.settings.require_forge()
            raise AssertionError("forge configured but no client given")
        return self._gitea

    # -- submit -------------------------------------------------------------------------

    def submit_batch(
        self, client_id: str, tasks: list[dict[str, Any]], callback_url: str | None = None,
        batch_ref: str | None = None,
    ) -> dict[str, Any]:
        """Seed API: validate, check funds, open issues. Rejections come back as dicts."""
        try:
            batch = BatchFile.model_validate(
                {"client_id": client_id, "tasks": tasks, "callback_url": callback_url,
                 "batch_ref": batch_ref}
            )
        except ValidationError as exc:
            return rejection_from_validation(exc).as_dict()
        try:
            return self.accept(batch, client_id)
        except BatchRejected as exc:
            return exc.as_dict()

    def accept(self, batch: BatchFile, client_id: str, *, source: str | None = None,
               sha256: str | None = None) -> dict[str, Any]:
        """Record a valid batch (or find its duplicate), then open its issues."""
        record, tasks, duplicate = self.record(batch, client_id, source=source, sha256=sha256)
        if not duplicate:
            log.info("batch %s: accepted %d tasks from %s (%s)", record.batch_id, record.total,
                     client_id, source or "api")
        numbers: dict[str, int] | None = None
        try:
            if self._gitea is not None:  # without a forge, the service creates them later
                numbers, _ = self._open(record, tasks, fresh=not duplicate)
        except ForgeError as exc:
            log.warning("batch %s: issue creation interrupted, will resume: %s",
                        record.batch_id, exc)
        if numbers is None:
            numbers = {t.task_id: t.issue_number for t in self.store.get_tasks(record.batch_id)
                       if t.issue_number is not None}
        order = [t.task_id for t in tasks] if tasks else list(numbers)
        result: dict[str, Any] = {
            "ok": True,
            "batch_id": record.batch_id,
            "issues": [{"task_id": task_id, "issue_number": numbers.get(task_id)}
                       for task_id in order],
        }
        if duplicate:
            result["duplicate"] = True
        return result

    def record(self, batch: BatchFile, client_id: str, *, source: str | None = None,
               sha256: str | None = None) -> tuple[BatchRecord, list[TaskRecord], bool]:
        """Store the batch before any forge call: (record, new tasks, is_duplicate); a
        duplicate comes back with no tasks. No forge I/O."""
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
                return earlier, [], not _own_unfiled(earlier, source, sha256)
            cost = self.core.check_funded(client_id, len(batch.tasks))
            record = self._new_record(batch, client_id, cost, source, sha256)
            tasks = [
                TaskRecord(task_id=t.task_id, batch_id=record.batch_id, repo=record.repo,
                           payload=t, created_at=record.created_at)
                for t in batch.tasks
            ]
            hold = self.core.hold_entry(client_id, cost, record.batch_id)
            self.store.create_batch(record, tasks, hold)
        return record, tasks, False

    def _new_record(self, batch: BatchFile, client_id: str, cost: int, source: str | None,
                    sha256: str | None) -> BatchRecord:
        now = utcnow()
        batch_id = new_batch_id(now)
        return BatchRecord(
            batch_id=batch_id, client_id=client_id, batch_ref=batch.batch_ref,
            callback_url=batch.callback_url, repo=self.repo_for(client_id, batch_id),
            source=source, sha256=sha256, total=len(batch.tasks), cost=cost,
            unit_price=self.core.task_price, created_at=now,
            deadline=now + timedelta(seconds=self._window(batch)),
        )

    def _window(self, batch: BatchFile) -> int:
        if batch.completion_window is None:
            return self.settings.completion_window
        seconds = window_seconds(batch.completion_window)
        low, high = 60, self.settings.max_completion_window
        if not low <= seconds <= high:
            raise BatchRejected("invalid_batch", f"completion_window: must be between {low} "
                                f"and {high} seconds", field="completion_window")
        return seconds

    def repo_for(self, client_id: str, batch_id: str) -> str:
        """The shared repo, or `<owner>/eval-<client_id>-<batch_id>`."""
        if self.settings.repo:
            return self.settings.repo
        return f"{self.settings.require_owner()}/eval-{client_id}-{batch_id}"

    # -- issues -------------------------------------------------------------------------

    def open_issues(self, batch_id: str) -> int:
        """Create the issues still missing for the batch; returns how many were created.

        Safe to call again after any interruption: a resumed intake first finds the issues
        an earlier attempt created (by their marker) and creates only the rest.
        """
        return len(self._open(self.store.get_batch(batch_id), [])[1])

    def _open(self, batch: BatchRecord, tasks: list[TaskRecord], *,
              fresh: bool = False) -> tuple[dict[str, int] | None, dict[str, int]]:
        """(issue number of every task that has one, the ones created now); (None, {}) when
        there was nothing to do. `tasks` may be given to save reading them; `fresh` means
        the batch was recorded just now, so no earlier attempt can have created issues."""
        if batch.intake_done or batch.status != "running" or batch.cancel_requested:
            return None, {}
        with self.store.intake_lease(batch.batch_id) as leased:
            if not leased:  # another process is creating this batch's issues right now
                return None, {}
            return self._open_leased(batch, tasks, fresh)

    def _open_leased(self, batch: BatchRecord, tasks: list[TaskRecord],
                     fresh: bool) -> tuple[dict[str, int] | None, dict[str, int]]:
        if not fresh:  # re-read: the lease holder before us may have stored progress
            batch, tasks = self.store.get_batch(batch.batch_id), []
            if batch.intake_done or batch.status != "running":
                return None, {}
        tasks = tasks or self.store.get_tasks(batch.batch_id)
        numbers = {t.task_id: t.issue_number for t in tasks if t.issue_number is not None}
        pending = [t for t in tasks if t.issue_number is None and t.status == "pending"]
        created: dict[str, int] = {}
        if pending:  # reaching the end below means every pending task now has its issue
            gitea = self.gitea
            gitea.ensure_repo(batch.repo)
            label_id = gitea.ensure_label(batch.repo, self.settings.task_label, LABEL_COLOR)
            if not fresh:  # an earlier attempt may have created some before it stopped
                adopted = self._adopt_existing(batch, pending)
                numbers.update(adopted)
                pending = [t for t in pending if t.task_id not in adopted]
            created = self._create_all(batch, pending, label_id)
            numbers.update(created)
            log.info("batch %s: created %d issues in %s", batch.batch_id, len(created),
                     batch.repo)
        self.store.update_batch(batch.batch_id, intake_done=True)
        return numbers, created

    def _adopt_existing(self, batch: BatchRecord, pending: list[TaskRecord]) -> dict[str, int]:
        wanted = {t.task_id for t in pending}
        found: dict[str, ForgeIssue] = {}
        since = batch.created_at - ADOPT_MARGIN
        for issue in self.gitea.iter_issues(batch.repo, labels=self.settings.task_label,
                                            since=since):
            marked = read_marker(issue.body)
            if marked is not None and marked[0] == batch.batch_id and marked[1] in wanted:
                found.setdefault(marked[1], issue)
        self.store.update_tasks(batch.batch_id, {k: _opened(i) for k, i in found.items()})
        if found:
            log.info("batch %s: found %d issues from an interrupted intake",
                     batch.batch_id, len(found))
        return {task_id: issue.number for task_id, issue in found.items()}

    def _create_all(self, batch: BatchRecord, tasks: list[TaskRecord],
                    label_id: int) -> dict[str, int]:
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
                    future = pool.submit(self.gitea.create_issue, batch.repo,
                                         task.payload.title, body, [label_id])
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
                        unsaved[task_id] = _opened(issue)
                        submit_next()
                    if time.monotonic() - last_flush >= FLUSH_SECONDS:
                        self.store.update_tasks(batch.batch_id, unsaved)
                        unsaved, last_flush = {}, time.monotonic()
            finally:
                for future in in_flight:
                    future.cancel()
                self.store.update_tasks(batch.batch_id, unsaved)
        return created

    # -- poll ---------------------------------------------------------------------------

    def poll_completed(self, batch_id: str, *, full: bool = False) -> list[str]:
        """Store results of issues the lane closed; open ones are skipped (seed API)."""
        return self.poll_batches([batch_id], full=full).get(batch_id, [])

    def poll_batches(self, batch_ids: list[str], *, full: bool = False,
                     probe: bool = True) -> dict[str, list[str]]:
        """Poll running batches that share one repo with a single paged listing.

        A normal poll asks only for issues closed since the oldest last poll (with an
        overlap for clock skew), so its requests depend on what changed, not on how many
        tasks are open; `full` lists every issue and checks the ones it cannot see one by
        one, so a deleted issue finishes its task as `missing` (with `probe`, only when the
        forge counts fewer open issues than the store expects). Returns finished task ids.
        """
        batches = [b for b in map(self.store.get_batch, batch_ids) if b.status == "running"]
        if not batches:
            return {}
        tasks = {b.batch_id: self.store.get_tasks(b.batch_id) for b in batches}
        open_tasks = {
            t.issue_number: (b, t) for b in batches for t in tasks[b.batch_id]
            if t.status == "open" and t.issue_number is not None
        }
        started = utcnow() - LOCAL_CLOCK_MARGIN
        changes: dict[str, dict[str, dict[str, Any]]] = {b.batch_id: {} for b in batches}
        unread: set[str] = set()  # batches with a result that could not be read this time
        if open_tasks:
            repo = batches[0].repo
            if full and probe:  # a listing of everything only when issues went missing
                full = self.gitea.count_issues(repo, state="open", labels=self.settings.
                                               task_label) < len(open_tasks)
            polled = [b.last_polled_at for b in batches if b.last_polled_at is not None]
            since = None
            if not full and len(polled) == len(batches):
                since = min(polled) - SINCE_OVERLAP
            self.gitea.listed_at = None
            for (batch, task), change in self._collect_closed(repo, open_tasks, since, full,
                                                              unread):
                changes[batch.batch_id][task.task_id] = change
            started = self.gitea.listed_at or started
        for batch in batches:
            finished = changes[batch.batch_id]
            self.store.update_tasks(batch.batch_id, finished)
            for task_id, change in finished.items():
                log.info("batch %s: task %s finished as %s", batch.batch_id, task_id,
                         change["status"])
            polled_at = batch.last_polled_at if batch.batch_id in unread else started
            self._refresh_progress(batch, _applied(tasks[batch.batch_id], finished), polled_at)
        return {batch_id: list(finished) for batch_id, finished in changes.items()}

    def _collect_closed(
        self, repo: str, open_tasks: dict[int, tuple[BatchRecord, TaskRecord]],
        since: datetime | None, full: bool, unread: set[str],
    ) -> Iterator[tuple[tuple[BatchRecord, TaskRecord], dict[str, Any]]]:
        seen: set[int] = set()
        for issue in self.gitea.iter_issues(repo, state="all" if full else "closed",
                                            labels=self.settings.task_label, since=since):
            seen.add(issue.number)
            owner = open_tasks.get(issue.number)
            if owner is not None and issue.state == "closed":
                try:
                    yield owner, self._finish(repo, issue)
                except ForgeError as exc:
                    log.warning("batch %s: result of issue #%d unreadable, retried next "
                                "cycle: %s", owner[0].batch_id, issue.number, exc)
                    unread.add(owner[0].batch_id)
        if full:
            for number, owner in open_tasks.items():
                change = None if number in seen else self._check_unseen(repo, number)
                if change is not None:
                    yield owner, change

    def _check_unseen(self, repo: str, number: int) -> dict[str, Any] | None:
        try:
            issue = self.gitea.get_issue(repo, number)
        except ForgeNotFound:
            return _missing("the issue was deleted before the lane finished it")
        return self._finish(repo, issue) if issue.state == "closed" else None

    def _finish(self, repo: str, issue: ForgeIssue) -> dict[str, Any]:
        try:
            comments = self.gitea.list_comments(repo, issue.number)
        except ForgeNotFound:
            return _missing("the issue was deleted")
        status, result = read_result(issue, comments, self.settings.label_results)
        return {"status": status, "result": result, "finished_at": issue.closed_at or utcnow()}

    def _refresh_progress(self, batch: BatchRecord, tasks: list[TaskRecord],
                          polled_at: datetime | None) -> BatchRecord:
        done = sum(1 for t in tasks if t.status in FINISHED_TASK_STATUSES)
        if done == len(tasks):
            log.info("batch %s: all %d tasks finished", batch.batch_id, done)
            return self._close(batch, tasks, "completed", polled_at)
        fields: dict[str, Any] = {"last_polled_at": polled_at}
        if done != batch.done:
            fields["done"] = done  # the index row is rewritten only when progress moved
        return self.store.update_batch(batch.batch_id, **fields)

    def _close(self, batch: BatchRecord, tasks: list[TaskRecord], status: str,
               polled_at: datetime | None = None) -> BatchRecord:
        """End a running batch: charge finished tasks, release the hold, set the final
        status and fix the report. Under the lock and only once: a batch another process
        closed meanwhile is returned as it is."""
        with self.store.locked():
            current = self.store.get_batch(batch.batch_id)
            if current.status != "running":
                return current
            finished = sum(1 for t in tasks if t.status in LANE_FINISHED)
            charged = finished * current.unit_price
            self.store.settle(self.core.settlement(current.client_id, current.batch_id,
                                                   current.cost, charged))
            final = current.model_copy(update={
                "status": status, "completed_at": utcnow(), "charged": charged,
                "done": len(tasks), "last_polled_at": polled_at or current.last_polled_at})
            # the report is fixed in the same write: every later emit sends these bytes
            closed = self.store.update_batch(
                batch.batch_id, status=status, completed_at=final.completed_at,
                charged=charged, done=final.done, last_polled_at=final.last_polled_at,
                report=build_report(final, tasks))
        log.info("batch %s: %s; charged %d, released %d", batch.batch_id, status, charged,
                 current.cost - charged)
        return closed

    # -- cancel and expire ---------------------------------------------------------------

    def cancel(self, batch_id: str) -> BatchRecord:
        """Cancel a running batch: its open issues get a comment, `eval-cancelled` and are
        closed; finished results are kept. The request is stored first, so a forge failure
        half-way is finished by a later poll cycle."""
        batch = self.store.get_batch(batch_id)
        if batch.status != "running":
            raise DropboxEvalError(f"batch {batch_id} is {batch.status}; only running batches "
                                   "can be cancelled")
        if not batch.cancel_requested:
            self.store.update_batch(batch_id, cancel_requested=True)
        return self._abort(batch_id, "cancelled", "Cancelled by the client before the lane "
                           "finished this task.")

    def expire_if_overdue(self, batch_id: str) -> bool:
        """Expire a running batch past its deadline (or finish a pending cancel)."""
        batch = self.store.get_batch(batch_id)
        if batch.status != "running":
            return False
        if batch.cancel_requested:
            self.cancel(batch_id)
            return True
        if batch.deadline is None or batch.deadline > utcnow():
            return False
        self._abort(batch_id, "expired", "The batch passed its completion window before the "
                    "lane finished this task.")
        return True

    def _abort(self, batch_id: str, status: str, why: str) -> BatchRecord:
        with self.store.intake_lease(batch_id, wait=LEASE_WAIT_SECONDS) as leased:
            if not leased:
                raise DropboxEvalError(f"batch {batch_id} is busy (its issues are being "
                                       "created); try again in a minute")
            try:
                self._close_open_issues(batch_id, status, why)
            except ForgeNotFound:  # the repo is gone: nothing is left to close on the forge
                log.warning("batch %s: repo not found; unfinished tasks end as %s", batch_id,
                            status)
            tasks = self.store.get_tasks(batch_id)
            ended = {"status": status, "finished_at": utcnow(),
                     "result": TaskResult(summary=why)}
            self.store.update_tasks(batch_id, {t.task_id: ended for t in tasks
                                               if t.status in ("open", "pending")})
            return self._close(self.store.get_batch(batch_id), self.store.get_tasks(batch_id),
                               status)

    def _close_open_issues(self, batch_id: str, status: str, why: str) -> None:
        """Keep what the lane finished, then comment, label and close every open issue."""
        self.poll_completed(batch_id)
        batch = self.store.get_batch(batch_id)
        if batch.status != "running":
            return
        tasks = self.store.get_tasks(batch_id)
        if any(t.status == "pending" for t in tasks):
            self._adopt_existing(batch, [t for t in tasks if t.status == "pending"])
            tasks = self.store.get_tasks(batch_id)
        open_tasks = [t for t in tasks if t.status == "open" and t.issue_number]
        if not open_tasks:
            return
        label_id = self.gitea.ensure_label(batch.repo, f"eval-{status}", "cccccc")
        closed: dict[str, dict[str, Any]] = {}
        ended = {"status": status, "finished_at": utcnow(), "result": TaskResult(summary=why)}
        try:
            for task in open_tasks:
                self._close_issue(batch.repo, task.issue_number or 0, label_id, why)
                closed[task.task_id] = ended
        finally:
            self.store.update_tasks(batch_id, closed)

    def _close_issue(self, repo: str, number: int, label_id: int, why: str) -> None:
        try:
            self.gitea.comment(repo, number, why)
            self.gitea.add_labels(repo, number, [label_id])
            self.gitea.close_issue(repo, number)
        except ForgeNotFound:
            pass  # deleted meanwhile: nothing left to close

    # -- emit ---------------------------------------------------------------------------

    def build_report(self, batch_id: str) -> dict[str, Any]:
        """The report document for a finished batch."""
        return build_report(self.store.get_batch(batch_id), self.store.get_tasks(batch_id))

    def emit(self, batch_id: str, *, force: bool = False) -> dict[str, Any]:
        """Deliver the report once every task finished; marks the batch `emitted`.

        Emitting an emitted batch does nothing unless `force`, which re-sends the identical
        payload. Raises DeliveryError when the callback keeps failing (the report is then
        kept in `outbox/undelivered/`).
        """
        batch = self.store.get_batch(batch_id)
        if batch.status == "running":
            return {"ok": False, "reason": "not_finished", "batch_id": batch_id,
                    "done": batch.done, "total": batch.total}
        if batch.emitted_at is not None and not force:
            return {"ok": True, "batch_id": batch_id, "already_emitted": True,
                    "emitted_at": batch.emitted_at.isoformat() if batch.emitted_at else None}
        report = batch.report or self.build_report(batch_id)  # fixed when the batch closed
        try:
            where = self.emitter.deliver(report, batch.callback_url, self._secret(batch))
        except DeliveryError as exc:
            self._delivery_failed(batch, exc)
            raise
        # completed -> emitted; cancelled and expired stay what they are, with emitted_at
        self.store.update_batch(batch_id, emitted_at=utcnow(),
                                status="emitted" if batch.status == "completed" else batch.status,
                                last_delivery_error=None, next_delivery_at=None)
        log.info("batch %s: report emitted to %s", batch_id, where)
        return {"ok": True, "batch_id": batch_id, "delivered_to": where}

    def _secret(self, batch: BatchRecord) -> str | None:
        client = self.store.get_client(batch.client_id)
        return (client.webhook_secret if client else None) or self.settings.webhook_secret

    def _delivery_failed(self, batch: BatchRecord, error: DeliveryError) -> None:
        attempts = batch.delivery_attempts + 1
        base, limit = self.settings.delivery_retry_base, self.settings.delivery_max_attempts
        delay = timedelta(seconds=min(base * 2 ** (attempts - 1), MAX_DELIVERY_DELAY))
        next_at = utcnow() + delay if attempts < limit else None
        self.store.update_batch(batch.batch_id, delivery_attempts=attempts,
                                last_delivery_error=str(error), next_delivery_at=next_at)
        if next_at is None:
            log.error("batch %s: delivery failed %d times, giving up; the report is in "
                      "outbox/undelivered/ (re-send with `dropbox-eval emit %s --force`)",
                      batch.batch_id, attempts, batch.batch_id)
        else:
            log.warning("batch %s: delivery failed (%d/%d), next try at %s: %s",
                        batch.batch_id, attempts, limit, next_at.isoformat(), error)

    def due_for_delivery(self, batch: BatchRecord) -> bool:
        """A finished, unemitted batch whose delivery is not waiting out a backoff or given
        up."""
        if batch.status not in ("completed", "cancelled", "expired") or batch.emitted_at:
            return False
        if batch.delivery_attempts == 0:
            return True
        return batch.next_delivery_at is not None and batch.next_delivery_at <= utcnow()


def _own_unfiled(batch: BatchRecord, source: str | None, sha256: str | None) -> bool:
    """The same drop, read again after a crash stopped it before it was filed: the batch
    resumes; it is not a duplicate of itself."""
    return (source is not None and not batch.filed and batch.source == source
            and batch.sha256 == sha256)


def _applied(tasks: list[TaskRecord], changes: dict[str, dict[str, Any]]) -> list[TaskRecord]:
    """The tasks as they are after `changes` were stored."""
    return [t.model_copy(update=changes[t.task_id]) if t.task_id in changes else t
            for t in tasks]


def _missing(why: str) -> dict[str, Any]:
    return {"status": "missing", "result": TaskResult(summary=why), "finished_at": utcnow()}


def _opened(issue: ForgeIssue) -> dict[str, Any]:
    return {"status": "open", "issue_number": issue.number, "issue_url": issue.html_url}


def check_task_count(count: int, limit: int) -> None:
    """Reject a batch with more tasks than the per-batch limit."""
    if count > limit:
        raise BatchRejected("too_many_tasks", f"{count} tasks; the limit is {limit}",
                            field="tasks", limit=limit)


def rejection_from_validation(exc: ValidationError) -> BatchRejected:
    """Turn pydantic's first error into a client-readable rejection with a field path."""
    first = exc.errors()[0]
    path = ".".join(str(part) for part in first["loc"]) or "(document)"
    return BatchRejected(
        "invalid_batch", f"{path}: {first['msg']}", field=path,
        errors=[{"field": ".".join(str(p) for p in e["loc"]), "reason": e["msg"]}
                for e in exc.errors()[:20]],
    )
