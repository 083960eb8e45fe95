"""Intake throughput: one N-task batch through the product vs a plain `requests` loop.

Both create the same N issues (same title, body, label) with 4 threads against a fresh
sandbox forge repo; the product run is `Intake.submit_batch` end to end (validation,
store, repo + label, issues, store flushes). Runs alternate (raw, product, product, raw, ...)
so drift hits both; the figure is the median of the per-pair ratios (raw time / product
time), which keeps a burst of load from other processes on this 2-core box out of it.
Create calls are timestamped (measurement only) to split the product's time into before the
first POST / creating / after the last answer.

    python bench/intake.py [--tasks 10000] [--pairs 3] [--inproc] [--json]
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol
from unittest import mock

from _common import (
    BenchResult,
    Stopwatch,
    command_line,
    emit,
    make_tasks,
    parser,
    settings_for,
)
from _forge import ForgeProcess
from _raw import raw_loop

from dropbox_eval.app import build_app
from dropbox_eval.forge.client import GiteaClient
from dropbox_eval.sandbox import SandboxForge

TARGET_RATIO = 0.8
THREADS = 4


class Forge(Protocol):
    url: str
    token: str
    user: str


@contextmanager
def fresh_forge(inproc: bool) -> Iterator[tuple[Forge, Callable[[], list[dict[str, Any]]]]]:
    """A new, empty sandbox forge and a function returning its request log."""
    if inproc:
        with SandboxForge(port=0) as forge:
            yield forge, lambda: [e.to_json() for e in forge.requests]
    else:
        with ForgeProcess() as proc:
            yield proc, proc.requests


class Phases:
    """Where a product run spends its time: before the first POST, creating, after the last."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        self.start = self.end = 0.0

    def split(self) -> tuple[float, float, float]:
        """(before the first create, first create .. last answer, after the last answer)."""
        first = min(s for s, _ in self.stamps)
        last = max(e for _, e in self.stamps)
        return first - self.start, last - first, self.end - last


@contextmanager
def timed_creates(phases: Phases) -> Iterator[None]:
    """Timestamp every `GiteaClient.create_issue` call (measurement only)."""
    original = GiteaClient.create_issue

    def create_issue(self: GiteaClient, *args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            end = time.perf_counter()
            with phases.lock:
                phases.stamps.append((begin, end))

    with mock.patch.object(GiteaClient, "create_issue", create_issue):
        yield


def product_run(forge: Forge, tasks: list[dict[str, Any]], phases: Phases) -> float:
    """Seconds for `submit_batch` of the whole batch (store + forge), 4 intake threads."""
    with tempfile.TemporaryDirectory(prefix="bench-intake-") as home:
        app = build_app(
            settings_for(home, forge.url, forge.token, forge.user, intake_concurrency=THREADS)
        )
        app.billing.add_client("bench", 0)
        with timed_creates(phases), Stopwatch() as watch:
            phases.start = watch.start
            result = app.intake.submit_batch("bench", tasks)
            phases.end = time.perf_counter()
        assert result["ok"], result
        missing = [i for i in result["issues"] if i["issue_number"] is None]
        assert not missing, f"{len(missing)} tasks without an issue"
    return watch.seconds


def count_creates(log: list[dict[str, Any]]) -> int:
    """Successful issue creations in a request log."""
    return sum(
        1
        for e in log
        if e["method"] == "POST" and e["path"].endswith("/issues") and e["status"] == 201
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--tasks", type=int, default=10_000)
    args_parser.add_argument(
        "--pairs", type=int, default=3, help="raw/product pairs, order alternating (default 3)"
    )
    args_parser.add_argument(
        "--inproc",
        action="store_true",
        help="serve the sandbox forge in this process (shares the GIL)",
    )
    args = args_parser.parse_args()
    started = time.perf_counter()
    tasks = make_tasks(args.tasks)

    def pair(index: int) -> tuple[float, float, Phases]:
        times: dict[str, float] = {}
        phases = Phases()
        order = ("raw", "product") if index % 2 == 0 else ("product", "raw")
        for kind in order:
            with fresh_forge(args.inproc) as (forge, request_log):
                if kind == "raw":
                    times[kind] = raw_loop(forge, tasks, THREADS, "raw-bench").seconds
                    continue
                times[kind] = product_run(forge, tasks, phases)
                assert count_creates(request_log()) == len(tasks), "wrong issue count"
        return times["raw"], times["product"], phases

    pairs = [pair(i) for i in range(args.pairs)]
    ratios = [raw / product for raw, product, _ in pairs]
    ratio = statistics.median(ratios)
    raw_rate = len(tasks) / statistics.median(raw for raw, _, _ in pairs)
    product_rate = len(tasks) / statistics.median(product for _, product, _ in pairs)
    splits = [phases.split() for _, _, phases in pairs]
    before = statistics.median(s[0] for s in splits)
    creating = statistics.median(s[1] for s in splits)
    after = statistics.median(s[2] for s in splits)
    result = BenchResult("intake", command_line())
    result.add(
        "product intake",
        product_rate,
        "tasks/s",
        note=f"{args.tasks} tasks; median of " + ", ".join(f"{p:.1f}s" for _, p, _ in pairs),
    )
    result.add(
        "raw requests loop (baseline)",
        raw_rate,
        "tasks/s",
        note=f"{THREADS} threads, Session per thread; median of "
        + ", ".join(f"{r:.1f}s" for r, _, _ in pairs),
    )
    result.add(
        "product / raw",
        ratio,
        "",
        f">= {TARGET_RATIO}",
        ratio >= TARGET_RATIO,
        note="median of per-pair ratios " + ", ".join(f"{r:.2f}" for r in ratios),
    )
    result.add(
        "product: before the first issue POST",
        before,
        "s",
        note="validate, store the batch, repo + label",
    )
    result.add(
        "product: first POST .. last answer",
        creating,
        "s",
        note=f"raw loop total: {statistics.median(r for r, _, _ in pairs):.1f} s",
    )
    result.add(
        "product: after the last answer",
        after,
        "s",
        note="store the issue numbers, build the result",
    )
    result.info["forge"] = (
        "in-process SandboxForge" if args.inproc else "SandboxForge in a child process"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
