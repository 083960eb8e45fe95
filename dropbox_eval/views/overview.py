"""Overview: the whole service at a glance, for the operator's page and `/metrics`.

Built from one read of the index (`Store.snapshot`: live rows, live ledger, clients and the
archive's running totals), then each live batch's record (and, for `/metrics`, its tasks):
its cost follows the live work, never the archived history (bench/metrics.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..errors import NotFoundError
from ..models import BatchRecord, BatchStatus, Client, TaskStatus, utcnow
from ..store import Store
from ..store.totals import Snapshot, charged_by, source_of
from ..util.timestamps import age
from .batches import batch_view, delivery_state
from .clients import client_view

RECENT = 20  # failed or expired batches the page shows
REPORT_OUTCOMES = ("delivered", "pending", "given_up")
BAD = (BatchStatus.FAILED, BatchStatus.EXPIRED)


@dataclass
class Overview:
    """Counts for `/metrics` and the lists the operator's page shows."""

    batches: dict[str, int]  # per status, every status (0 included)
    accepted: dict[str, int]  # batches per way in: "inbox", "api"
    reports: dict[str, int]  # reports of ended batches: delivered, pending, given_up
    failed_delivery_attempts: int  # of the reports not delivered yet
    oldest_undelivered: datetime | None  # when the oldest undelivered batch ended
    clients: list[dict[str, Any]]  # client views with `charged`
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    undelivered: list[dict[str, Any]] = field(default_factory=list)
    ended_badly: list[dict[str, Any]] = field(default_factory=list)
    tasks: dict[str, int] | None = None  # per status, for /metrics

    def oldest_undelivered_age(self, now: datetime | None = None) -> float:
        """Seconds since the oldest ended, undelivered batch ended (0: none)."""
        if self.oldest_undelivered is None:
            return 0.0
        return max(0.0, ((now or utcnow()) - self.oldest_undelivered).total_seconds())


def build_overview(store: Store, *, for_metrics: bool = False) -> Overview:
    """The overview from one snapshot of the index (see the module docstring). For
    `/metrics` with the task counts; for the page with the newest archived failed batches."""
    snapshot = store.snapshot()
    now = utcnow()
    statuses = {str(status): 0 for status in BatchStatus}
    merge(statuses, snapshot.archived.batches, count_by(str(r["status"]) for r in snapshot.live))
    accepted = {"inbox": 0, "api": 0}
    merge(accepted, snapshot.archived.sources, count_by(source_of(r) for r in snapshot.live))
    delivered = sum(snapshot.archived.batches.values())
    delivered += sum(1 for row in snapshot.live if row.get("emitted_at"))
    overview = Overview(
        batches=statuses,
        accepted=accepted,
        reports=dict.fromkeys(REPORT_OUTCOMES, 0) | {"delivered": delivered},
        failed_delivery_attempts=0,
        oldest_undelivered=None,
        clients=_clients(snapshot),
    )
    for record in _records(store, snapshot, archived=not for_metrics):
        _add(overview, record, now)
    overview.ended_badly = overview.ended_badly[-RECENT:]
    if for_metrics:
        overview.tasks = _task_counts(store, snapshot)
    return overview


def _records(store: Store, snapshot: Snapshot, *, archived: bool) -> Iterable[BatchRecord]:
    """The records worth a look, by id: live batches not delivered yet, and failed or
    expired ones (live, and with `archived` the newest archived); a batch gone since the
    snapshot is skipped."""
    rows = {str(r["batch_id"]): r for r in snapshot.archived.recent_bad} if archived else {}
    rows |= {str(r["batch_id"]): r for r in snapshot.live}
    for batch_id in sorted(rows):
        row = rows[batch_id]
        if row.get("emitted_at") and row["status"] not in BAD:
            continue  # delivered and fine: nothing to act on
        with contextlib.suppress(NotFoundError):
            yield store.get_batch(batch_id)


def _add(overview: Overview, record: BatchRecord, now: datetime) -> None:
    """List one batch where the page shows it, and count an undelivered report."""
    view = batch_view(record) | {"age": age(record.created_at, now)}
    if record.status == BatchStatus.RUNNING:
        overview.in_flight.append(view)
        return
    if record.status in BAD:
        overview.ended_badly.append(view)
    if record.emitted_at is not None:
        return
    given_up = delivery_state(record) == "given_up"
    overview.reports["given_up" if given_up else "pending"] += 1
    overview.failed_delivery_attempts += record.delivery_attempts
    overview.undelivered.append(view)
    ended = record.completed_at or record.created_at
    if overview.oldest_undelivered is None or ended < overview.oldest_undelivered:
        overview.oldest_undelivered = ended


def _clients(snapshot: Snapshot) -> list[dict[str, Any]]:
    charged = dict(snapshot.archived.charged)
    merge(charged, charged_by(snapshot.ledger))
    clients = sorted(snapshot.clients, key=lambda r: str(r["client_id"]))
    return [
        client_view(Client.model_validate(row), charged.get(str(row["client_id"]), 0))
        for row in clients
    ]


def _task_counts(store: Store, snapshot: Snapshot) -> dict[str, int]:
    totals = {str(status): 0 for status in TaskStatus}
    merge(totals, snapshot.archived.tasks)
    for row in snapshot.live:
        with contextlib.suppress(NotFoundError):  # archived since the snapshot
            tasks = store.get_tasks(str(row["batch_id"]))
            merge(totals, count_by(str(t.status) for t in tasks))
    return totals


def merge(into: dict[str, int], *counts: dict[str, int]) -> None:
    """Add each of `counts` into `into`, key by key."""
    for each in counts:
        for name, count in each.items():
            into[name] = into.get(name, 0) + count


def count_by(keys: Iterable[str]) -> dict[str, int]:
    """How often each key occurs."""
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts
