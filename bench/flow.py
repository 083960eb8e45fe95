"""Intake against a forge with a knee: the product with its default settings / a raw
`requests` loop at the forge's best thread count.

The forge runs in its own process, answering each API request after `--delay` s with at
most `--capacity` requests served at once (SANDBOX_CAPACITY): its throughput tops out near
capacity / delay (160/s at the defaults) and its latency climbs past that, as a real
server's does (it never errors under load). In one run:

1. the knee: the raw loop (repo + label + one POST per task, one Session per thread) at
   each `--sweep` thread count against one forge; the count with the best throughput is
   the knee;
2. `--pairs` pairs, order alternating, each run against a fresh forge: the raw loop at the
   knee creating `--tasks` issues, and the product creating the same from one drop (a
   `Service` with default settings: the budget starts at SAAS_EVAL_INTAKE_CONCURRENCY=4
   and is found by AIMD up to SAAS_EVAL_FORGE_MAX_INFLIGHT=64), timed from the rename into
   the inbox until every issue is created and stored (`intake_done`). Per-batch mode.

The figure is the median of the per-pair ratios product time / raw time (target <= 1.2);
the budget the product settled at is printed beside it.

    python bench/flow.py [--tasks 2000] [--pairs 3] [--delay 0.1] [--capacity 16]
                         [--sweep 8,12,16,24,32,48] [--sweep-tasks 480] [--quick] [--json]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _common import (
    BenchResult,
    add_median_ratio,
    command_line,
    emit,
    interleaved,
    make_tasks,
    parser,
)
from _forge import ForgeProcess, forge_arguments, forge_note
from _raw import best, knee, raw_loop, sweep_note
from _service import Budget, created, drop, running, sampling, wait_until

TARGET = 1.2


def product_intake(
    capacity: int, delay: float, tasks: list[dict[str, Any]]
) -> tuple[float, Budget]:
    """Seconds from the drop's rename until its last issue is created and stored."""
    with ForgeProcess(capacity=capacity, delay=delay) as forge:
        with running(forge, ["acme"]) as run, sampling(run.scheduler) as sampler:
            start = drop(run.inbox("acme"), "big.json", {"batch_ref": "big", "tasks": tasks})
            batch_id = run.batch_id("acme", "big.json")
            wait_until(lambda: run.opened(batch_id), pause=0.02)
            seconds = time.perf_counter() - start
        made = created(forge.requests("/issues"))
    if made != len(tasks):
        raise RuntimeError(f"the product created {made} issues for {len(tasks)} tasks")
    return seconds, sampler


def raw_at(capacity: int, delay: float, tasks: list[dict[str, Any]], threads: int) -> float:
    """Seconds of the raw loop at `threads` against a fresh forge."""
    with ForgeProcess(capacity=capacity, delay=delay) as forge:
        return raw_loop(forge, tasks, threads, "raw-bench").seconds


def budget_note(sampler: Budget) -> str:
    """The budget's range and the calls in flight while the product worked."""
    limits = [s.limit for s in sampler.samples] or [0]
    flying = [s.in_flight for s in sampler.samples] or [0]
    return (
        f"budget {min(limits)}..{max(limits)} (median {statistics.median(limits):.0f}), "
        f"in flight median {statistics.median(flying):.0f}"
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--tasks", type=int, default=2000)
    args_parser.add_argument("--pairs", type=int, default=3)
    forge_arguments(args_parser)
    args_parser.add_argument("--sweep", default="8,12,16,24,32,48")
    args_parser.add_argument("--sweep-tasks", type=int, default=480)
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = args_parser.parse_args()
    if args.quick:
        args.tasks, args.pairs, args.sweep, args.sweep_tasks = 400, 1, "8,16,32", 160
    started = time.perf_counter()
    counts = [int(n) for n in args.sweep.split(",")]
    with ForgeProcess(capacity=args.capacity, delay=args.delay) as forge:
        sweep = knee(forge, make_tasks(args.sweep_tasks), counts)
    top = best(sweep)
    tasks = make_tasks(args.tasks)
    runs = interleaved(
        args.pairs,
        lambda: raw_at(args.capacity, args.delay, tasks, top.threads),
        lambda: product_intake(args.capacity, args.delay, tasks),
    )
    pairs = [(raw, product, budget) for raw, (product, budget) in runs]
    ratios = [product / raw for raw, product, _ in pairs]
    result = BenchResult("flow", command_line())
    result.add(
        "raw loop at the knee (baseline)",
        args.tasks / statistics.median(raw for raw, _, _ in pairs),
        "tasks/s",
        note=f"{top.threads} threads; sweep {sweep_note(sweep)}",
    )
    result.add(
        "product intake, default settings",
        args.tasks / statistics.median(product for _, product, _ in pairs),
        "tasks/s",
        note="; ".join(f"{p:.1f} s, {budget_note(s)}" for _, p, s in pairs),
    )
    add_median_ratio(
        result, f"intake of {args.tasks} tasks: product time / raw at the knee", ratios, TARGET
    )
    result.info["setup"] = (
        f"{forge_note(args)}, a fresh one for every run; the service with default settings; "
        "one repo per batch"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
