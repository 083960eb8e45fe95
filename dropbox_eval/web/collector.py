"""StateCollector: the metrics read from the state folder at scrape time (see metrics.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..inbox.scan import candidates
from ..models import BatchStatus, TaskStatus, utcnow
from ..rejections import RejectionLog
from ..service import read_status
from .health import service_running
from .metrics import PREFIX

if TYPE_CHECKING:
    from ..app import App


class StateCollector(Collector):
    """Metrics read from the state folder at scrape time."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.rejections = RejectionLog(app.settings.state_path)
        self._archived_tasks: dict[str, dict[str, int]] = {}  # archived batches never change

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape."""
        rows = self.app.store.list_batches()
        yield from self._files(rows)
        statuses = {str(status): 0 for status in BatchStatus} | _count(rows, "status")
        yield _family(GaugeMetricFamily, "batches", "Batches by status.", "status", statuses)
        yield _family(
            GaugeMetricFamily, "tasks", "Tasks by status.", "status", self._task_counts(rows)
        )
        yield from self._deliveries(rows)
        yield _family(
            CounterMetricFamily,
            "forge_webhooks",
            "Forge webhook deliveries received by this process, by outcome (accepted, "
            "unsigned, bad_signature, replayed, unknown_repo, ignored_event, ...).",
            "outcome",
            dict(self.app.webhooks.counts),
        )
        yield from self._credits()
        yield from self._service()
        waiting = len(candidates(self.app.settings.inbox_path))
        yield GaugeMetricFamily(
            f"{PREFIX}_inbox_waiting_files",
            "Files in the inbox not yet taken (waiting for readiness or the service).",
            value=waiting,
        )

    def _files(self, rows: list[dict[str, Any]]) -> Iterator[Metric]:
        accepted = {"inbox": 0, "api": 0}
        for row in rows:
            source = row.get("source")  # a dropped file's path, or none/"api"
            accepted["inbox" if source and source != "api" else "api"] += 1
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
            "Dropped files rejected, by reason (from state/rejections.jsonl; drops on rotation).",
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

    def _task_counts(self, rows: list[dict[str, Any]]) -> dict[str, int]:
        totals = {str(status): 0 for status in TaskStatus}
        for row in rows:
            batch_id = str(row["batch_id"])
            counts = self._archived_tasks.get(batch_id)
            if counts is None:
                counts = _count(
                    [t.model_dump(mode="json") for t in self.app.store.get_tasks(batch_id)],
                    "status",
                )
                if row.get("emitted_at"):
                    self._archived_tasks[batch_id] = counts
            for status, count in counts.items():
                totals[status] = totals.get(status, 0) + count
        return totals

    def _deliveries(self, rows: list[dict[str, Any]]) -> Iterator[Metric]:
        outcomes = {"delivered": 0, "pending": 0, "given_up": 0}
        failed_attempts = 0
        oldest: datetime | None = None
        for row in rows:
            if row.get("emitted_at"):
                outcomes["delivered"] += 1
            elif row["status"] != BatchStatus.RUNNING:
                batch = self.app.store.get_batch(str(row["batch_id"]))
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

    def _credits(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            f"{PREFIX}_credits_held", "Credits held by running batches.", labels=["client"]
        )
        balance = GaugeMetricFamily(
            f"{PREFIX}_credits_balance", "Credit balance per client.", labels=["client"]
        )
        charged = CounterMetricFamily(
            f"{PREFIX}_credits_charged", "Credits charged for lane work.", labels=["client"]
        )
        for client in self.app.store.list_clients():
            held.add_metric([client.client_id], client.held)
            balance.add_metric([client.client_id], client.balance)
            spent = sum(
                -e.amount for e in self.app.store.ledger(client.client_id) if e.kind == "charge"
            )
            charged.add_metric([client.client_id], spent)
        yield from (held, balance, charged)


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
