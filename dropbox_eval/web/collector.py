"""StateCollector: the metrics read from the state folder at scrape time (see metrics.py).

The numbers come from the read model (`views.Overview`: one read of the index, then each
live batch), so they always match the store, whatever process serves them, and a scrape's
cost follows the live work, never the archived history (bench/metrics.py measures it).
Money per client is off unless SAAS_EVAL_METRICS_PER_CLIENT is set: a scrape is often
readable by more people than the ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..inbox.scan import candidates
from ..rejections import REJECTION_REASONS
from ..timestamps import parse
from ..views import Overview, Views
from ..webhooks import WEBHOOK_OUTCOMES
from .metrics import PREFIX

if TYPE_CHECKING:
    from ..app import App

MONEY = (
    ("credits_balance", GaugeMetricFamily, "balance", "Credit balance"),
    ("credits_held", GaugeMetricFamily, "held", "Credits held by running batches"),
    ("credits_charged", CounterMetricFamily, "charged", "Credits charged for lane work"),
)


class StateCollector(Collector):
    """Metrics read from the state folder at scrape time."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.views = Views(app.store)

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape."""
        overview = self.views.overview(for_metrics=True)
        rejected = dict.fromkeys(REJECTION_REASONS, 0) | self.views.rejection_counts()
        webhooks = dict.fromkeys(WEBHOOK_OUTCOMES, 0) | dict(self.app.webhooks.counts)
        yield from (
            _family(
                CounterMetricFamily, "batches_accepted", BY_SOURCE, "source", overview.accepted
            ),
            _family(CounterMetricFamily, "files_rejected", BY_REASON, "reason", rejected),
            _family(GaugeMetricFamily, "batches", "Batches by status.", "status", overview.batches),
            _family(GaugeMetricFamily, "tasks", "Tasks by status.", "status", overview.tasks or {}),
            _family(GaugeMetricFamily, "reports", BY_REPORT, "outcome", overview.reports),
            _family(CounterMetricFamily, "forge_webhooks", BY_WEBHOOK, "outcome", webhooks),
        )
        yield from self._deliveries(overview)
        yield from self._credits(overview)
        yield from self._service()
        yield GaugeMetricFamily(
            f"{PREFIX}_inbox_waiting_files",
            "Files in the inbox not yet taken (waiting for readiness or the service).",
            value=len(candidates(self.app.settings.inbox_path)),
        )

    def _deliveries(self, overview: Overview) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_report_failed_attempts",
            "Failed delivery attempts of the reports not delivered yet.",
            value=overview.failed_delivery_attempts,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_oldest_undelivered_report_age_seconds",
            "Seconds since the oldest ended batch without a delivered report ended (0: none).",
            value=overview.oldest_undelivered_age(),
        )

    def _credits(self, overview: Overview) -> Iterator[Metric]:
        """Per client with SAAS_EVAL_METRICS_PER_CLIENT; otherwise the sums only."""
        per_client = self.app.settings.metrics_per_client
        for name, kind, field, text in MONEY:
            if not per_client:
                total = sum(int(client[field]) for client in overview.clients)
                yield kind(f"{PREFIX}_{name}", f"{text}, all clients.", value=total)
                continue
            family = kind(f"{PREFIX}_{name}", f"{text}, per client.", labels=["client"])
            for client in overview.clients:
                family.add_metric([str(client["client_id"])], int(client[field]))
            yield family

    def _service(self) -> Iterator[Metric]:
        service = self.views.service()
        yield GaugeMetricFamily(
            f"{PREFIX}_service_running",
            "1 while a `dropbox-eval run` holds the state folder.",
            value=int(bool(service["running"])),
        )
        last_poll = service.get("last_poll_at") if service["running"] else None
        yield GaugeMetricFamily(
            f"{PREFIX}_last_poll_timestamp_seconds",
            "When the running service last finished a forge poll cycle (0: none).",
            value=parse(last_poll).timestamp() if last_poll else 0.0,
        )


BY_SOURCE = "Batches accepted, by how they came (a dropped file, the HTTP API, or a retry)."
BY_REASON = "Dropped files rejected, by reason (kept in state/rejections.counts.json)."
BY_REPORT = "Reports of ended batches: delivered, pending (due or retrying), given_up."
BY_WEBHOOK = (
    "Forge webhook deliveries received by this process, by outcome (accepted, unsigned, "
    "bad_signature, replayed, unknown_repo, ignored_event, ...)."
)


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
