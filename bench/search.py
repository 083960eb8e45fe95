"""The cross-repo search the poll cycle sends, against a small and a large instance.

Gitea resolves a search's `labels=eval-task` to the id of every label of that name in the
whole instance (`GetLabelIDsByNames`) and hands the issue indexer that list; with one repo
per batch the list grows with every batch ever run, and with every other team's repos that
use the name. The product's search names no label (the owner filter bounds it, the marker
decides). The product runs one poll cycle through the search against a sandbox instance of
`--small` and one of `--large` other repos carrying the label (plus its own `--batches`
repos, both forges in this process); the search request it sent is then replayed
`--samples` times on each, in turn.
Figures: the label ids that request makes the forge resolve (what Gitea hands its
indexer), and the median request time, large / small; the same for the old request with
`labels=eval-task`, for context (the sandbox does not model the indexer's cost of a long id
list, so the old request's time understates Gitea's; its id count does not).

    python bench/search.py [--small 10] [--large 3000] [--batches 3] [--samples 200] [--json]
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from urllib.parse import parse_qsl, urlencode

import requests
from _common import (
    BenchResult,
    command_line,
    emit,
    make_tasks,
    parser,
    settings_for,
)

from dropbox_eval.app import build_app, forge_worker
from dropbox_eval.sandbox import SandboxForge

TARGET = 1.2


def _instance(others: int, batches: int) -> tuple[SandboxForge, list[tuple[str, str]]]:
    """A running forge with `others` labelled repos of another owner, and the product's
    `batches`; returns the forge and the product's search query (as sent)."""
    forge = SandboxForge(port=0).start()
    state = forge.state
    for i in range(others):
        state.create_repo(state.org.login, f"team-{i}")
        label = int(state.create_label(state.org.login, f"team-{i}", "eval-task", "ff0000")["id"])
        state.create_issue(state.org.login, f"team-{i}", forge.user, "work", labels=[label])
    with tempfile.TemporaryDirectory(prefix="bench-search-") as home:
        app = build_app(settings_for(home, forge.url, forge.token, forge.user))
        app.billing.add_client("bench", 0)
        for _ in range(batches):
            app.intake.submit_batch("bench", make_tasks(5))
        worker = forge_worker(app, threading.Event(), lambda what, exc: None)
        wait(worker.cycle())  # the first cycle lists every repo once
        forge.clear_requests()
        wait(worker.cycle())  # then the search
    sent = [r for r in forge.requests if r.path.endswith("/repos/issues/search")]
    if not sent:
        raise RuntimeError("the poll cycle sent no search")
    return forge, parse_qsl(sent[0].query)


def _medians_ms(calls: list[Callable[[], object]], samples: int) -> list[float]:
    """Median milliseconds of each call, the calls taken in turn (load hits all alike)."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(samples):
        for slot, call in enumerate(calls):
            started = time.perf_counter()
            call()
            times[slot].append((time.perf_counter() - started) * 1000)
    return [statistics.median(t) for t in times]


def _searcher(forge: SandboxForge, query: list[tuple[str, str]]) -> Callable[[], object]:
    session = requests.Session()
    session.headers["Authorization"] = f"token {forge.token}"
    url = f"{forge.url}/api/v1/repos/issues/search?{urlencode(query)}"
    return lambda: session.get(url, timeout=30).raise_for_status()


def _label_ids(forge: SandboxForge, query: list[tuple[str, str]]) -> int:
    names = [n for key, value in query if key == "labels" for n in value.split(",") if n]
    return len(forge.state.label_ids_named(names))


def main() -> None:
    """Measure and print."""
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--small", type=int, default=10)
    args_parser.add_argument("--large", type=int, default=3000)
    args_parser.add_argument("--batches", type=int, default=3)
    args_parser.add_argument("--samples", type=int, default=200)
    args = args_parser.parse_args()
    result = BenchResult("search", command_line())
    started = time.perf_counter()
    instances = [_instance(size, args.batches) for size in (args.small, args.large)]
    try:
        product_query = instances[1][1]
        calls = [
            _searcher(forge, query + extra)
            for extra in ([], [("labels", "eval-task")])
            for forge, query in instances
        ]
        ms, large_ms, old_ms, old_large_ms = _medians_ms(calls, args.samples)
        small = {"ms": ms, "old_ms": old_ms}
        large = {"ms": large_ms, "old_ms": old_large_ms}
        for figures, (forge, query) in zip((small, large), instances, strict=True):
            figures["ids"] = _label_ids(forge, query)
            figures["old_ids"] = _label_ids(forge, [*query, ("labels", "eval-task")])
    finally:
        for forge, _query in instances:
            forge.stop()
    result.add(
        f"label ids the product's search makes the forge resolve, {args.large:,} labelled repos",
        large["ids"],
        "ids",
        "0",
        large["ids"] == 0,
        note=f"query: {urlencode([(k, v) for k, v in product_query if k != 'since'])}&since=...",
    )
    result.add(
        "the same with labels=eval-task (the old request)",
        large["old_ids"],
        "ids",
        note=f"{small['old_ids']:.0f} with {args.small} labelled repos",
    )
    ratio = large["ms"] / small["ms"]
    result.add(
        f"product's search request, {args.large:,} / {args.small} labelled repos",
        round(ratio, 2),
        "ratio",
        f"<= {TARGET}",
        ratio <= TARGET,
        note=f"median {large['ms']:.2f} vs {small['ms']:.2f} ms over {args.samples} each",
    )
    old_ratio = large["old_ms"] / small["old_ms"]
    result.add(
        "the old request (labels=eval-task), the same sizes",
        round(old_ratio, 2),
        "ratio",
        note=f"median {large['old_ms']:.2f} vs {small['old_ms']:.2f} ms",
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
