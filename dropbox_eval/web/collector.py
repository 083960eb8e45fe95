"""StateCollector: the metrics read from the state folder at scrape time (see metrics.py).

The numbers come from the read model (`views.Overview`: one read of the index, then each
live batch), so they always match the store, whatever process serves them, and a scrape's
cost follows the live work, never the archived history (bench/metrics.py measures it).
Money per client is off unless SAAS_EVAL_METRICS_PER_CLIENT is set: a scrape is often
readable by more people than the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..errors import DropboxEvalError
from ..inbox.scan import candidates
from ..ops.metrics import PREFIX
from ..protocol.rejections import REJECTION_REASONS
from ..results.webhooks import WEBHOOK_OUTCOMES
from ..util import storage
from ..util.timestamps import parse
from ..views import Overview, Views

if TYPE_CHECKING:
    from ..config import Settings
    from ..results.webhooks import WebhookReceiver
    from ..store import Store

log = logging.getLogger("dropbox_eval")
MONEY = (
    ("credits_balance", GaugeMetricFamily, "balance", "Credit balance"),
    ("credits_held", GaugeMetricFamily, "held", "Credits held by running batches"),
    ("credits_charged", CounterMetricFamily, "charged", "Credits charged for lane work"),
)


class StateCollector(Collector):
    """Metrics read from the state folder at scrape time."""

    def __init__(self, store: Store, settings: Settings, webhooks: WebhookReceiver) -> None:
        """`settings`: the folders and whether money is shown per client; `webhooks`: this
        process's receiver, whose outcomes are counted."""
        self.views = Views(store)
        self.settings = settings
        self.webhooks = webhooks

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape. A part that cannot be read now (a full
        or refused state folder, a file mid-repair) is left out of this scrape, logged and
        counted in `scrape_errors`: it never fails the whole scrape."""
        failed = 0
        for part in (self._store, self._counts, self._service, self._inbox, self._storage):
            try:
                metrics = list(part())
            except (DropboxEvalError, OSError) as exc:
                log.warning("metrics: %s left out of this scrape: %s", part.__name__[1:], exc)
                failed += 1
                continue
            yield from metrics
        yield GaugeMetricFamily(
            f"{PREFIX}_scrape_errors",
            "Parts of this scrape left out because they could not be read (the log says why).",
            value=failed,
        )

    def _store(self) -> Iterator[Metric]:
        overview = self.views.overview(for_metrics=True)
        yield from (
            _family(
                CounterMetricFamily, "batches_accepted", BY_SOURCE, "source", overview.accepted
            ),
            _family(GaugeMetricFamily, "batches", "Batches by status.", "status", overview.batches),
            _family(GaugeMetricFamily, "tasks", "Tasks by status.", "status", overview.tasks or {}),
            _family(GaugeMetricFamily, "reports", BY_REPORT, "outcome", overview.reports),
        )
        yield from self._deliveries(overview)
        yield from self._credits(overview)

    def _counts(self) -> Iterator[Metric]:
        """Rejections (state/rejections.counts.json) and this process's webhook outcomes."""
        rejected = dict.fromkeys(REJECTION_REASONS, 0) | self.views.rejection_counts()
        webhooks = dict.fromkeys(WEBHOOK_OUTCOMES, 0) | dict(self.webhooks.counts)
        yield _family(CounterMetricFamily, "files_rejected", BY_REASON, "reason", rejected)
        yield _family(CounterMetricFamily, "forge_webhooks", BY_WEBHOOK, "outcome", webhooks)

    def _inbox(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_inbox_waiting_files",
            "Files in the inbox not yet taken (waiting for readiness or the service).",
            value=len(candidates(self.settings.inbox_path)),
        )

    def _storage(self) -> Iterator[Metric]:
        """Whether each folder takes writes (storage.py; looked at without writing)."""
        family = GaugeMetricFamily(
            f"{PREFIX}_storage_writable",
            "1 while the folder takes writes; 0 while it is full, read-only or refused "
            "(/readyz names the cause).",
            labels=["folder"],
        )
        for label, folder in storage.folders(self.settings):
            writable = storage.probe(label, folder) is None
            family.add_metric([label.split()[0]], int(writable))
        yield family

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
        per_client = self.settings.metrics_per_client
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
        workers = (service.get("workers") or {}) if service["running"] else {}
        restarts = CounterMetricFamily(
            f"{PREFIX}_worker_restarts",
            "Restarts of each worker of the running service after its loop failed.",
            labels=["worker"],
        )
        up = GaugeMetricFamily(
            f"{PREFIX}_worker_up",
            "1 while the worker runs (or waits for its inbox), 0 while it restarts or failed.",
            labels=["worker"],
        )
        for name, worker in sorted(workers.items()):
            restarts.add_metric([name], int(worker.get("restarts", 0)))
            up.add_metric([name], int(worker.get("state") in ("running", "waiting")))
        yield from (restarts, up)
        yield GaugeMetricFamily(  # worker_up counts a wait as up: this one tells it apart
            f"{PREFIX}_inbox_watched",
            "1 while the running service watches an inbox folder that is there; 0 while "
            "it waits for a missing one (a share not mounted), or no service runs.",
            value=int(workers.get("inbox-worker", {}).get("state") == "running"),
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
