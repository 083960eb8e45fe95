"""Poller: closed issues -> task results, one paged listing per repo for all its batches."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from .config import Settings
from .errors import ForgeError, ForgeNotFound
from .forge import ForgeIssue, GiteaClient
from .models import BatchRecord, BatchStatus, TaskRecord, TaskResult, TaskStatus, utcnow
from .report import read_result
from .settle import Settler
from .store import Store

log = logging.getLogger("dropbox_eval")

# `since` is taken from the forge's own clock (the Date of the previous listing), so one
# second covers its whole-second precision; our clock is used only without a Date header.
SINCE_OVERLAP = timedelta(seconds=1)
LOCAL_CLOCK_MARGIN = timedelta(minutes=2)
Owner = tuple[BatchRecord, TaskRecord]


class Poller:
    """Stores the results of issues the lane closed and moves each batch's progress."""

    def __init__(
        self, store: Store, gitea: GiteaClient | None, settings: Settings, settler: Settler
    ) -> None:
        self.store = store
        self._gitea = gitea
        self.settings = settings
        self.settler = settler

    @property
    def gitea(self) -> GiteaClient:
        """The forge client; a ConfigError names the missing setting when there is none."""
        return self.settings.forge_client(self._gitea)

    def poll_completed(self, batch_id: str, *, full: bool = False) -> list[str]:
        """Store results of issues the lane closed; open ones are skipped (seed API)."""
        return self.poll_batches([batch_id], full=full).get(batch_id, [])

    def poll_batches(
        self, batch_ids: list[str], *, full: bool = False, probe: bool = True
    ) -> dict[str, list[str]]:
        """Poll running batches that share one repo with a single paged listing.

        A normal poll asks only for issues closed since the oldest last poll (with an
        overlap for clock skew), so its requests depend on what changed, not on how many
        tasks are open; `full` lists every issue and checks the ones it cannot see one by
        one, so a deleted issue finishes its task as `missing` (with `probe`, only when the
        forge counts fewer open issues than the store expects). Returns finished task ids.
        """
        batches = [
            b for b in map(self.store.get_batch, batch_ids) if b.status == BatchStatus.RUNNING
        ]
        if not batches:
            return {}
        tasks = {b.batch_id: self.store.get_tasks(b.batch_id) for b in batches}
        open_tasks = {
            t.issue_number: (b, t)
            for b in batches
            for t in tasks[b.batch_id]
            if t.status == TaskStatus.OPEN and t.issue_number is not None
        }
        started = utcnow() - LOCAL_CLOCK_MARGIN
        changes: dict[str, dict[str, dict[str, Any]]] = {b.batch_id: {} for b in batches}
        unread: set[str] = set()  # batches with a result that could not be read this time
        if open_tasks:
            started = (
                self._list_closed(batches, open_tasks, full, probe, changes, unread) or started
            )
        for batch in batches:
            finished = changes[batch.batch_id]
            self.store.update_tasks(batch.batch_id, finished)
            for task_id, change in finished.items():
                log.info(
                    "batch %s: task %s finished as %s", batch.batch_id, task_id, change["status"]
                )
            polled_at = batch.last_polled_at if batch.batch_id in unread else started
            self.refresh_progress(batch, _applied(tasks[batch.batch_id], finished), polled_at)
        return {batch_id: list(finished) for batch_id, finished in changes.items()}

    def _list_closed(
        self,
        batches: list[BatchRecord],
        open_tasks: dict[int, Owner],
        full: bool,
        probe: bool,
        changes: dict[str, dict[str, dict[str, Any]]],
        unread: set[str],
    ) -> datetime | None:
        repo = batches[0].repo
        label = self.settings.task_label
        if full and probe:  # a listing of everything only when issues went missing
            full = self.gitea.count_issues(repo, state="open", labels=label) < len(open_tasks)
        polled = [b.last_polled_at for b in batches if b.last_polled_at is not None]
        since = None
        if not full and len(polled) == len(batches):
            since = min(polled) - SINCE_OVERLAP
        self.gitea.listed_at = None
        for (batch, task), change in self._collect_closed(repo, open_tasks, since, full, unread):
            changes[batch.batch_id][task.task_id] = change
        return self.gitea.listed_at

    def _collect_closed(
        self,
        repo: str,
        open_tasks: dict[int, Owner],
        since: datetime | None,
        full: bool,
        unread: set[str],
    ) -> Iterator[tuple[Owner, dict[str, Any]]]:
        seen: set[int] = set()
        for issue in self.gitea.iter_issues(
            repo, state="all" if full else "closed", labels=self.settings.task_label, since=since
        ):
            seen.add(issue.number)
            owner = open_tasks.get(issue.number)
            if owner is not None and issue.state == "closed":
                try:
                    yield owner, self.finish(repo, issue)
                except ForgeError as exc:
                    log.warning(
                        "batch %s: result of issue #%d unreadable, retried next cycle: %s",
                        owner[0].batch_id,
                        issue.number,
                        exc,
                    )
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
            return ended(TaskStatus.MISSING, "the issue was deleted before the lane finished it")
        return self.finish(repo, issue) if issue.state == "closed" else None

    def finish(self, repo: str, issue: ForgeIssue) -> dict[str, Any]:
        """The task change for a closed issue: status, result and when it finished."""
        try:
            comments = self.gitea.list_comments(repo, issue.number)
        except ForgeNotFound:
            return ended(TaskStatus.MISSING, "the issue was deleted")
        status, result = read_result(issue, comments, self.settings.label_results)
        return {
            "status": TaskStatus(status),
            "result": result,
            "finished_at": issue.closed_at or utcnow(),
        }

    def refresh_progress(
        self, batch: BatchRecord, tasks: list[TaskRecord], polled_at: datetime | None
    ) -> BatchRecord:
        """Store the progress; a batch whose every task finished is settled `completed`."""
        done = sum(1 for t in tasks if t.status.is_finished)
        if done == len(tasks):
            log.info("batch %s: all %d tasks finished", batch.batch_id, done)
            return self.settler.close(
                batch.batch_id, tasks, BatchStatus.COMPLETED, polled_at=polled_at
            )
        fields: dict[str, Any] = {"last_polled_at": polled_at}
        if done != batch.done:
            fields["done"] = done  # the index row is rewritten only when progress moved
        return self.store.update_batch(batch.batch_id, **fields)


def ended(status: TaskStatus, why: str) -> dict[str, Any]:
    """The change that finishes a task without the lane's verdict."""
    return {"status": status, "result": TaskResult(summary=why), "finished_at": utcnow()}


def _applied(tasks: list[TaskRecord], changes: dict[str, dict[str, Any]]) -> list[TaskRecord]:
    """The tasks as they are after `changes` were stored."""
    return [t.model_copy(update=changes[t.task_id]) if t.task_id in changes else t for t in tasks]
