"""Prometheus metrics: forge exchanges counted as they happen, the rest read from the store.

Everything that must survive a restart (batches, tasks, deliveries, credits, rejections) is
computed from the state folder at scrape time by `StateCollector` (live batches plus the
archive's running totals kept in the index), so the numbers always match the store and both
`run --http-port` and a separate `serve` see the same values.
Only the forge exchanges are process-local (a counter and a latency histogram fed by a
`requests` response hook); a restart resets them, which `rate()` expects.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import requests
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector

PREFIX = "dropbox_eval"
_ROUTE_RULES = (
    (re.compile(r"^(/api/v1/repos)/[^/]+/[^/]+"), r"\1/{owner}/{repo}"),
    (re.compile(r"^(/api/v1/(?:orgs|users))/[^/]+"), r"\1/{name}"),
    (re.compile(r"/\d+(?=/|$)"), "/{id}"),
)


def route_template(path: str) -> str:
    """The route a forge URL path was sent to, without owner, repo and numbers (bounded
    label values): `/api/v1/repos/{owner}/{repo}/issues/{id}`."""
    for pattern, replacement in _ROUTE_RULES:
        path = pattern.sub(replacement, path)
    return path


class Metrics:
    """One registry per wired App: the forge exchanges, plus the state once registered."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.forge_requests = Counter(
            f"{PREFIX}_forge_requests",
            "Forge API exchanges by method, route template and HTTP status code.",
            ["method", "route", "code"],
            registry=self.registry,
        )
        self.forge_latency = Histogram(
            f"{PREFIX}_forge_request_duration_seconds",
            "Forge API response time (until the headers arrived).",
            ["method", "route"],
            registry=self.registry,
        )
        self._state: Collector | None = None

    def observe_forge(self, response: requests.Response, *_args: Any, **_kwargs: Any) -> None:
        """`requests` response hook: count and time one forge exchange."""
        request = response.request
        method = str(request.method or "GET")
        route = route_template(urlsplit(str(request.url)).path)
        self.forge_requests.labels(method, route, str(response.status_code)).inc()
        self.forge_latency.labels(method, route).observe(response.elapsed.total_seconds())

    def watch_state(self, collector: Collector) -> None:
        """Add the store-derived metrics (once)."""
        if self._state is None:
            self._state = collector
            self.registry.register(collector)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
