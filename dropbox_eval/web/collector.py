"""StateCollector: the metrics read from the state folder at scrape time (see metrics.py).

A scrape reads the index once (`Store.snapshot`: live batches, live ledger, clients and the
archive's running totals), then each live batch's record or tasks: its cost follows the
live work, never the archived history (bench/metrics.py measures it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..errors import NotFoundError
from ..inbox.scan import candidates
from ..models import BatchStatus, TaskStatus, utcnow
from ..rejections import RejectionLog
from ..service import read_status
from ..store.totals import Snapshot, charged_by, source_of
from .health import service_running
from .metrics import PREFIX

if TYPE_CHECKING:
    from ..app import App

T = TypeVar("T")


class StateCollector(Collector):
    """Metrics read from the state folder at scrape time."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.rejections = RejectionLog(app.settings.state_path)

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape."""
        snapshot = self.app.store.snapshot()
        yield from self._files(snapshot)
        statuses = {str(status): 0 for status in BatchStatus}
        _merge(statuses, snapshot.archived.batches, _count(snapshot.live, "status"))
        yield _family(GaugeMetricFamily, "batches", "Batches by status.", "status", statuses)
        yield _family(
            GaugeMetricFamily, "tasks", "Tasks by status.", "status", self._task_counts(snapshot)
        )
        yield from self._deliveries(snapshot)
        yield _family(
            CounterMetricFamily,
            "forge_webhooks",
            "Forge webhook deliveries received by this process, by outcome (accepted, "
            "unsigned, bad_signature, replayed, unknown_repo, ignored_event, ...).",
            "outcome",
            dict(self.app.webhooks.counts),
        )
        yield from self._credits(snapshot)
        yield from self._service()
        waiting = len(candidates(self.app.settings.inbox_path))
        yield GaugeMetricFamily(
            f"{PREFIX}_inbox_waiting_files",
            "Files in the inbox not yet taken (waiting for readiness or the service).",
            value=waiting,
        )

    def _files(self, snapshot: Snapshot) -> Iterator[Metric]:
        accepted = {"inbox": 0, "api": 0}
        _merge(accepted, snapshot.archived.sources, _count_by(snapshot.live, source_of))
        yield _family(
            CounterMetricFamily,
            "batches_accepted",
            "Batches accepted, by how they came (a dropped file, or the HTTP API).",
            "source",
            accepted,
        )
        yield _family(
            CounterMetricFamily,
            "files_rejected",
            "Dropped files rejected, by reason (kept in state/rejections.counts.json).",
            "reason",
            self.rejections.counts(),
        )

    def _service(self) -> Iterator[Metric]:
        state = self.app.settings.state_path
        running = service_running(state)
        yield GaugeMetricFamily(
            f"{PREFIX}_service_running",
            "1 while a `dropbox-eval run` holds the state folder.",
            value=int(running),
        )
        last_poll = read_status(state).get("last_poll_at") if running else None
        yield GaugeMetricFamily(
            f"{PREFIX}_last_poll_timestamp_seconds",
            "When the running service last finished a forge poll cycle (0: none).",
            value=datetime.fromisoformat(last_poll).timestamp() if last_poll else 0.0,
        )

    def _task_counts(self, snapshot: Snapshot) -> dict[str, int]:
        totals = {str(status): 0 for status in TaskStatus}
        _merge(totals, snapshot.archived.tasks)
        for row in snapshot.live:
            with contextlib.suppress(NotFoundError):  # archived since the snapshot
                tasks = self.app.store.get_tasks(str(row["batch_id"]))
                _merge(totals, _count_by(tasks, lambda t: str(t.status)))
        return totals

    def _deliveries(self, snapshot: Snapshot) -> Iterator[Metric]:
        delivered = sum(snapshot.archived.batches.values())
        outcomes = {"delivered": delivered, "pending": 0, "given_up": 0}
        failed_attempts = 0
        oldest: datetime | None = None
        for row in snapshot.live:
            if row.get("emitted_at"):
                outcomes["delivered"] += 1
            elif row["status"] != BatchStatus.RUNNING:
                try:
                    batch = self.app.store.get_batch(str(row["batch_id"]))
                except NotFoundError:
                    continue
                given_up = batch.delivery_attempts > 0 and batch.next_delivery_at is None
                outcomes["given_up" if given_up else "pending"] += 1
                failed_attempts += batch.delivery_attempts
                ended = batch.completed_at or batch.created_at
                oldest = ended if oldest is None else min(oldest, ended)
        yield _family(
            GaugeMetricFamily,
            "reports",
            "Reports of ended batches: delivered, pending (due or retrying), given_up.",
            "outcome",
            outcomes,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_report_failed_attempts",
            "Failed delivery attempts of the reports not delivered yet.",
            value=failed_attempts,
        )
        age = (utcnow() - oldest).total_seconds() if oldest else 0.0
        yield GaugeMetricFamily(
            f"{PREFIX}_oldest_undelivered_report_age_seconds",
            "Seconds since the oldest ended batch without a delivered report ended (0: none).",
            value=max(age, 0.0),
        )

    def _credits(self, snapshot: Snapshot) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            f"{PREFIX}_credits_held", "Credits held by running batches.", labels=["client"]
        )
        balance = GaugeMetricFamily(
            f"{PREFIX}_credits_balance", "Credit balance per client.", labels=["client"]
        )
        charged = CounterMetricFamily(
            f"{PREFIX}_credits_charged", "Credits charged for lane work.", labels=["client"]
        )
        spent = dict(snapshot.archived.charged)
        _merge(spent, charged_by(snapshot.ledger))
        for client in sorted(snapshot.clients, key=lambda c: str(c["client_id"])):
            client_id = str(client["client_id"])
            held.add_metric([client_id], client.get("held", 0))
            balance.add_metric([client_id], client["balance"])
            charged.add_metric([client_id], spent.get(client_id, 0))
        yield from (held, balance, charged)


def _merge(into: dict[str, int], *counts: dict[str, int]) -> None:
    for each in counts:
        for name, count in each.items():
            into[name] = into.get(name, 0) + count


def _count_by(items: Iterable[T], key: Callable[[T], str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[key(item)] = counts.get(key(item), 0) + 1
    return counts


def _count(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row[key])] = counts.get(str(row[key]), 0) + 1
    return counts


def _family(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    documentation: str,
    label: str,
    values: dict[str, int],
) -> Metric:
    family = kind(f"{PREFIX}_{name}", documentation, labels=[label])
    for value, count in sorted(values.items()):
        family.add_metric([value], count)
    return family
