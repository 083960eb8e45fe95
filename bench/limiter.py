"""The forge budget (AIMD) over time: it backs off when the forge slows down or answers
503, and recovers within seconds once the forge is well again.

A real `Service` takes in `--clients` x 2 large batches against a sandbox forge in its own
process (`--delay` s per request, at most `--capacity` served at once: see flow.py), while
the scheduler's budget (`limiter.limit`) and the calls in flight are sampled every 0.1 s.
On a fixed timeline the forge

1. runs normally for `--steady` s;
2. slows down: every request takes `--slow` x the delay, for `--disturb` s;
3. runs normally again for `--recover` s;
4. answers 503 to every request for `--outage` s (a burst);
5. runs normally again for `--recover` s.

Figures per disturbance: the lowest budget during it / the median budget in the 4 s before
(it backs off: target < 1), and the budget `--within` s after it ended / before (it
recovers: target >= 0.8), with the seconds until it was back at 0.8 x before.

Settings: the defaults, but SAAS_EVAL_POLL_INTERVAL=1 and SAAS_EVAL_RETRY_BASE=1: a 503
stops every intake it hits, and a stopped batch is resumed by the next poll cycle after its
backoff (by default up to 30 s + 5 s later, which would leave the budget idle, not wrong).

    python bench/limiter.py [--delay 0.1] [--capacity 16] [--slow 4] [--steady 10]
                            [--disturb 8] [--recover 15] [--outage 1] [--within 5]
                            [--quick] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import BenchResult, command_line, emit, make_tasks, parser
from _forge import ForgeProcess, forge_arguments, forge_note
from _service import Budget, Sample, drop, running, sampling

BACKS_OFF = 1.0
RECOVERS = 0.8
BEFORE = 4.0


def timeline(sampler: Budget, events: list[tuple[float, str]]) -> str:
    """`budget/in flight` at each whole second, events marked where they happened."""
    marks = {int(at): label for at, label in events}
    last = int(sampler.samples[-1].at) if sampler.samples else 0
    cells = []
    for second in range(last + 1):
        window = sampler.between(second, second + 1)
        value = f"{window[-1].limit}/{window[-1].in_flight}" if window else "-"
        cells.append(f"[{marks[second]}] {value}" if second in marks else value)
    return " ".join(cells)


def add_disturbance(
    result: BenchResult,
    name: str,
    sampler: Budget,
    span: tuple[float, float],
    within: float,
) -> None:
    """Backed off (lowest during / before) and recovered (`within` s after / before)."""
    begin, end = span
    before = statistics.median(s.limit for s in sampler.between(begin - BEFORE, begin))
    lowest = min(s.limit for s in sampler.between(begin, end + 1))
    back = sampler.between(end + within - 0.5, end + within + 0.5)
    after = statistics.median(s.limit for s in back)
    took = _back_after(sampler, end, lambda s: s.limit >= RECOVERS * before)
    busy = statistics.median(s.in_flight for s in sampler.between(begin - BEFORE, begin))
    flying = _back_after(sampler, end, lambda s: s.in_flight >= RECOVERS * busy)
    backed = lowest / before
    result.add(
        f"{name}: lowest budget during / before",
        backed,
        "x",
        f"< {BACKS_OFF:g}",
        backed < BACKS_OFF,
        note=f"{lowest} vs median {before:g} in the {BEFORE:g} s before",
    )
    recovered = after / before
    result.add(
        f"{name}: budget {within:g} s after / before",
        recovered,
        "x",
        f">= {RECOVERS:g}",
        recovered >= RECOVERS,
        note=f"{after:g} vs {before:g}; back at {RECOVERS:g} x before after {took}; calls "
        f"in flight back at {RECOVERS:g} x before ({busy:g}) after {flying}",
    )


def _back_after(sampler: Budget, end: float, back: Callable[[Sample], bool]) -> str:
    """Seconds from `end` to the first sample for which `back` holds."""
    found = [s.at - end for s in sampler.between(end, end + 60) if back(s)]
    observed = sampler.samples[-1].at - end
    return f"{found[0]:.1f} s" if found else f"not within the {observed:.0f} s observed"


def run_timeline(
    forge: ForgeProcess,
    args: argparse.Namespace,
    sampler: Budget,
    events: list[tuple[float, str]],
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Disturb the forge on the timeline; the (begin, end) of both disturbances."""

    def at(label: str, action: Callable[[], None]) -> float:
        action()
        moment = time.perf_counter() - sampler.start
        events.append((moment, label))
        return moment

    time.sleep(args.steady)
    slow_begin = at("slow", lambda: forge.set_delay(args.delay * args.slow))
    time.sleep(args.disturb)
    slow_end = at("normal", lambda: forge.set_delay(args.delay))
    time.sleep(args.recover)
    burst_begin = at("503", lambda: forge.fail_for(args.outage))
    time.sleep(args.outage)
    burst_end = time.perf_counter() - sampler.start
    time.sleep(args.recover)
    return (slow_begin, slow_end), (burst_begin, burst_end)


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--clients", type=int, default=2)
    args_parser.add_argument("--tasks", type=int, default=3000, help="per batch")
    forge_arguments(args_parser)
    args_parser.add_argument("--slow", type=float, default=4.0)
    args_parser.add_argument("--steady", type=float, default=10.0)
    args_parser.add_argument("--disturb", type=float, default=8.0)
    args_parser.add_argument("--recover", type=float, default=15.0)
    args_parser.add_argument("--outage", type=float, default=1.0)
    args_parser.add_argument("--within", type=float, default=5.0)
    args_parser.add_argument("--quick", action="store_true", help="shorter phases")
    args = args_parser.parse_args()
    if args.quick:
        args.steady, args.disturb, args.recover = 6.0, 4.0, 7.0
    started = time.perf_counter()
    names = [f"c{n}" for n in range(args.clients)]
    events: list[tuple[float, str]] = []
    settings: dict[str, Any] = {"poll_interval": 1.0, "retry_base": 1.0}
    with (
        ForgeProcess(capacity=args.capacity, delay=args.delay) as forge,
        running(forge, names, **settings) as run,
        sampling(run.scheduler) as sampler,
    ):
        for client in names:
            for n in range(2):
                document = {"batch_ref": f"b{n}", "tasks": make_tasks(args.tasks, f"{n}-")}
                drop(run.inbox(client), f"b{n}.json", document)
        slow, burst = run_timeline(forge, args, sampler, events)
        searches = len(forge.requests("/repos/issues/search"))
    result = BenchResult("limiter", command_line())
    add_disturbance(result, f"forge {args.slow:g}x slower", sampler, slow, args.within)
    add_disturbance(result, f"{args.outage:g} s of 503s", sampler, burst, args.within)
    result.info["budget/in flight by second"] = timeline(sampler, events)
    result.info["cross-repo search pages"] = (
        f"{searches} in {sampler.samples[-1].at:.0f} s (each poll cycle pages through every "
        "issue created since the last; the cycle plans the resumption of stopped intakes)"
    )
    result.info["setup"] = (
        f"{args.clients} clients x 2 batches x {args.tasks} tasks; {forge_note(args)}; "
        "default settings but poll interval 1 s and retry base 1 s; one repo per batch"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
