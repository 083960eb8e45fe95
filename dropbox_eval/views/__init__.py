"""The one read model: what the CLI, the API, the operator's page, `/metrics` and the demo
show of batches, tasks, clients and the service. None of them reads the store on its own.

Every time is RFC 3339 UTC with `Z` (timestamps.py); a batch's progress counts the tasks
whose result is still settling (progress.py).
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFoundError
from ..models import BatchRecord, BatchStatus
from ..protocol.rejections import RejectionLog
from ..store import BatchRow, Store
from .batches import batch_view, delivery_state, for_client, row_view, task_view, times
from .clients import client_view, key_view, ledger_view
from .links import with_forge_links
from .overview import Overview, build_overview
from .progress import Progress
from .service import service_view

__all__ = [
    "Overview",
    "Progress",
    "Views",
    "batch_view",
    "client_view",
    "delivery_state",
    "for_client",
    "ledger_view",
    "task_view",
]


class Views:
    """The read model over one store (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def batch(self, batch_id: str, *, client_id: str | None = None) -> dict[str, Any]:
        """One batch with its tasks. With `client_id`, another client's batch is unknown
        (NotFoundError), exactly like a batch that does not exist."""
        record = self._record(batch_id, client_id)
        return batch_view(record, self.store.get_tasks(batch_id))

    def batch_summary(self, batch_id: str, *, client_id: str | None = None) -> dict[str, Any]:
        """One batch without its tasks (one small file: for following a batch live)."""
        return batch_view(self._record(batch_id, client_id))

    def tombstone(self, batch_id: str, *, client_id: str | None = None) -> dict[str, Any] | None:
        """What stays of a deleted batch (ops/retention.py); None when it was not deleted,
        or (with `client_id`) is another client's."""
        buried = self.store.tombstone(batch_id)
        if buried is None or client_id not in (None, buried.get("client_id")):
            return None
        return buried

    def _record(self, batch_id: str, client_id: str | None) -> BatchRecord:
        record = self.store.get_batch(batch_id)
        if client_id is not None and record.client_id != client_id:
            raise NotFoundError(f"no batch {batch_id!r}")
        return record

    def batches(
        self,
        *,
        client_id: str | None = None,
        status: str | None = None,
        limit: int = 50,
        offset: int = 0,
        every: bool = False,
        finished: bool = False,
        matches: int | None = None,
        after: str | None = None,
    ) -> list[dict[str, Any]]:
        """A page of batches: the live first, newest created first, then the ended, most
        recently ended first (only ended ones if
        `finished`; `matches`: how many the filter matches, see `Store.page_batches`;
        `after`: a cursor, the rows after that batch id); `every`: the whole history,
        oldest created first. Each row carries its progress."""
        if status and status not in BatchStatus.__members__.values():
            return []  # no batch has it
        wanted = BatchStatus(status) if status else None
        if every:
            rows = self.store.list_batches(client_id=client_id, status=wanted)
        else:
            rows = self.store.page_batches(
                client_id=client_id,
                status=wanted,
                limit=limit,
                offset=offset,
                finished=finished,
                matches=matches,
                after=after,
            )
        return [row_view(row.as_dict(), self._progress(row)) for row in rows]

    def _progress(self, row: BatchRow) -> Progress:
        """A running batch's settling count is on its record; a batch that ended early
        counts what the lane finished from its tasks."""
        status, batch_id = row.status, row.batch_id
        try:
            if status is BatchStatus.RUNNING:
                record = self.store.get_batch(batch_id)
                return Progress.of(status, record.total, record.done, record.settling_tasks)
            if status in (BatchStatus.CANCELLED, BatchStatus.EXPIRED, BatchStatus.FAILED):
                return Progress.from_tasks(status, self.store.get_tasks(batch_id))
        except NotFoundError:  # moved to the archive meanwhile: the row is enough
            pass
        return Progress.of(status, row.total, row.done)

    def finished(
        self, *, client_id: str | None = None, status: str | None = None, limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of ended batches, newest first, and how many the filter matches in all
        (from the index's counts, which also end the read at the oldest match): the cost
        follows the page, not the history."""
        counts = self.count(client_id)
        total = (
            counts.get(status, 0)
            if status
            else sum(n for name, n in counts.items() if name != BatchStatus.RUNNING)
        )
        rows = self.batches(
            client_id=client_id,
            status=status,
            limit=limit,
            offset=offset,
            finished=True,
            matches=total,
        )
        return rows, total

    def batch_page(
        self, batch_id: str, forge_url: str | None, *, client_id: str | None = None
    ) -> dict[str, Any]:
        """One batch with its tasks (`batch`) and links to its repo, issues and pull
        requests on the forge at `forge_url` (links.py)."""
        view = with_forge_links(self.batch(batch_id, client_id=client_id), forge_url)
        return self.mark_pending_retry(view)

    def mark_pending_retry(self, view: dict[str, Any]) -> dict[str, Any]:
        """`retry_pending` on a batch view whose `retried_by` names a retry a crash stopped
        before it was recorded (retry.py reserves the id first): the page then offers Retry
        again, which finishes it under that id, instead of a link to nothing."""
        retry = view.get("retried_by")
        view["retry_pending"] = bool(retry) and not self.store.is_recorded(str(retry))
        return view

    def count(self, client_id: str | None = None) -> dict[str, int]:
        """Batches per status, for everyone or one client (the index alone)."""
        return self.store.count_batches(client_id)

    def find(self, client_id: str, batch_ref: str) -> str | None:
        """The id of a client's batch with this `batch_ref`, if any."""
        return self.store.find_batch(client_id, batch_ref=batch_ref)

    def clients(self) -> list[dict[str, Any]]:
        """Every client account."""
        return [client_view(client) for client in self.store.list_clients()]

    def client(self, client_id: str, *, ledger_limit: int | None = 50) -> dict[str, Any]:
        """One client with its newest ledger entries (every one with `ledger_limit` None)."""
        client = self.store.get_client(client_id)
        if client is None:
            raise NotFoundError(f"no client {client_id!r}")
        ledger = self.store.ledger(client_id, limit=ledger_limit)
        return client_view(client) | {"ledger": [ledger_view(e) for e in ledger]}

    def api_keys(self, client_id: str) -> list[dict[str, Any]]:
        """A client's API keys: ids, issue and last-use times (never a key)."""
        client = self.store.get_client(client_id)
        if client is None:
            raise NotFoundError(f"no client {client_id!r}")
        return [key_view(key) for key in client.api_keys]

    def audit(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The newest `limit` operator actions of the audit log, oldest first."""
        return [
            entry.model_dump(mode="json", exclude_none=True)
            for entry in self.store.audit_entries(limit)
        ]

    def overview(self, *, for_metrics: bool = False) -> Overview:
        """The whole service at a glance: the page's lists, or `/metrics`' counts."""
        return build_overview(self.store, for_metrics=for_metrics)

    def rejections(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest rejected drops first (reason, message, file, client, time)."""
        recent = RejectionLog(self.store.state_dir).recent(limit)
        return [times(row, ("rejected_at",)) for row in recent]

    def rejection_counts(self) -> dict[str, int]:
        """Rejected drops per reason since the state folder began."""
        return RejectionLog(self.store.state_dir).counts()

    def service(self) -> dict[str, Any]:
        """Whether the service runs, since when, its last poll and error (service.py)."""
        return service_view(self.store.state_dir, self.store.flags())
