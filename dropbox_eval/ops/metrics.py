"""Prometheus metrics: what this process does, counted as it happens; the rest read from the
store at scrape time (collector.py).

Process-local (a restart resets them, which `rate()` expects): forge exchanges, counted and
timed around each call in `ForgeTransport._send` (exceptions included: a timeout or a
refused connection is an outcome, not a gap), report deliveries by outcome, drop -> receipt
and poll-cycle durations, and the forge scheduler's current in-flight limit. Every counter
whose labels are known in advance is created at 0, so `rate()` and `increase()` see the
first event; `_created` series are not exported (they only add noise).
"""

from __future__ import annotations

import platform
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from .. import __version__
from ..forge.transport import CONNECT_TIMEOUT

disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus-client has no hints here

PREFIX = "dropbox_eval"
FORGE_OUTCOMES = ("2xx", "3xx", "4xx", "5xx", "timeout", "connection")
DELIVERY_OUTCOMES = ("delivered", "failed")
DROP_OUTCOMES = ("accepted", "rejected")
_SHORT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LONG = (*_SHORT, 30.0, 60.0, 120.0, 300.0, 600.0)
_ROUTE_RULES = (
    (re.compile(r"^(/api/v1/repos)/[^/]+/[^/]+"), r"\1/{owner}/{repo}"),
    (re.compile(r"^(/api/v1/(?:orgs|users))/[^/]+"), r"\1/{name}"),
    (re.compile(r"/\d+(?=/|$)"), "/{id}"),
)


def route_template(path: str) -> str:
    """The route a forge URL path was sent to, without owner, repo and numbers (bounded
    label values): `/api/v1/repos/{owner}/{repo}/issues/{id}`."""
    path = urlsplit(path).path
    for pattern, replacement in _ROUTE_RULES:
        path = pattern.sub(replacement, path)
    return path


def forge_outcome(code: str) -> str:
    """`2xx` ... `5xx` for a status code; `timeout` and `connection` as they are."""
    return f"{code[0]}xx" if code.isdigit() else code


def forge_buckets(timeout: float) -> tuple[float, ...]:
    """Duration buckets that reach past the longest a forge call may take (connect plus
    read timeout), so a slow or timing-out forge shows in the quantiles."""
    longest = CONNECT_TIMEOUT + timeout
    return tuple(sorted({*_SHORT, 20.0, 30.0, timeout, longest, 2 * longest}))


class Metrics:
    """One registry per wired App: this process's events, plus the state once registered."""

    def __init__(self, forge_timeout: float = 30.0) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        Info(f"{PREFIX}_build", "Version of dropbox-eval and Python.", registry=self.registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        self.forge_requests = Counter(
            f"{PREFIX}_forge_requests",
            "Forge API calls by method, route template and code (HTTP status, timeout, "
            "connection).",
            ["method", "route", "code"],
            registry=self.registry,
        )
        self.forge_outcomes = _counter(
            self.registry,
            "forge_calls",
            "Forge API calls by outcome: status class, timeout or connection.",
            "outcome",
            FORGE_OUTCOMES,
        )
        self.forge_latency = Histogram(
            f"{PREFIX}_forge_request_duration_seconds",
            "Forge API call duration, until the answer's headers or the failure.",
            ["method", "route"],
            buckets=forge_buckets(forge_timeout),
            registry=self.registry,
        )
        self.forge_inflight_limit = Gauge(
            f"{PREFIX}_forge_inflight_limit",
            "Forge calls the scheduler lets run at once now (0: no scheduler set one).",
            registry=self.registry,
        )
        self.deliveries = _counter(
            self.registry,
            "deliveries",
            "Report delivery attempts by outcome.",
            "outcome",
            DELIVERY_OUTCOMES,
        )
        self.drop_to_receipt = Histogram(
            f"{PREFIX}_drop_to_receipt_seconds",
            "From a drop's last change (its rename into place) to its receipt or error file.",
            ["outcome"],
            buckets=_LONG,
            registry=self.registry,
        )
        for outcome in DROP_OUTCOMES:
            self.drop_to_receipt.labels(outcome)
        self.poll_cycle = Histogram(
            f"{PREFIX}_poll_cycle_duration_seconds",
            "A forge poll cycle, from its start until its last repo visit returned.",
            buckets=_LONG,
            registry=self.registry,
        )

    def observe_forge(self, method: str, path: str, code: str, seconds: float) -> None:
        """Count and time one forge call (forgehttp.Observer)."""
        route = route_template(path)
        self.forge_requests.labels(method, route, code).inc()
        self.forge_outcomes.labels(forge_outcome(code)).inc()
        self.forge_latency.labels(method, route).observe(seconds)

    def set_forge_inflight_limit(self, limit: float) -> None:
        """The forge scheduler's current limit of calls in flight (it calls this whenever
        the limit moves)."""
        self.forge_inflight_limit.set(limit)

    def count_delivery(self, outcome: str) -> None:
        """One delivery attempt: `delivered` or `failed`."""
        self.deliveries.labels(outcome).inc()

    def observe_drop(self, outcome: str, seconds: float) -> None:
        """A drop got its receipt (`accepted`) or error file (`rejected`) `seconds` after
        its last change."""
        self.drop_to_receipt.labels(outcome).observe(max(0.0, seconds))

    def time_cycle(self, visits: Iterable[Future[Any]], started: float) -> None:
        """Observe a poll cycle's duration once every visit it started has returned
        (`started` is its `time.monotonic()`)."""
        pending = list(visits)
        if not pending:
            self.poll_cycle.observe(time.monotonic() - started)
            return
        left = [len(pending)]
        lock = threading.Lock()

        def one_done(_future: Future[Any]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self.poll_cycle.observe(time.monotonic() - started)

        for visit in pending:
            visit.add_done_callback(one_done)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


def _counter(
    registry: CollectorRegistry, name: str, documentation: str, label: str, values: Iterable[str]
) -> Counter:
    """A counter with one label whose every value starts at 0."""
    counter = Counter(f"{PREFIX}_{name}", documentation, [label], registry=registry)
    for value in values:
        counter.labels(value)
    return counter
