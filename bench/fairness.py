"""Fairness at the forge: client B's one-task drop while client A's large batches are being
taken in, against the same drop with A idle.

The forge runs in its own process (`--delay` s per request, at most `--capacity` served at
once: see flow.py), so A's backlog saturates it and every request waits there too. Blocks
alternate, quiet and busy, each with a fresh service (default settings) on the same forge:

- quiet: B drops `--drops` one-task batches one after another (written to `.part`, fsynced,
  renamed into place), A idle;
- busy: A drops `--a-batches` batches of `--a-tasks` tasks, and once A's issues are being
  created B drops the same; every B drop must end while A's batches are still being opened
  (checked; else the block fails: A's batches must outlast it).

The figure is B's rename -> its issue created (the forge's 201, from its request log), p50
busy / p50 quiet, target <= 2. The first B drop of each block is a warm-up.

    python bench/fairness.py [--drops 10] [--rounds 2] [--a-batches 4] [--a-tasks 1500]
                             [--delay 0.1] [--capacity 16] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import time

from _common import BenchResult, command_line, emit, make_tasks, parser, percentile
from _forge import ForgeProcess, forge_arguments, forge_note
from _service import Running, created, drop, running, wait_until

TARGET = 2.0


def b_drops(run: Running, forge: ForgeProcess, drops: int, busy: list[str]) -> list[float]:
    """B's rename -> issue created, one drop at a time; `busy`: A's batches, which must all
    be still opening when each of B's issues appears."""
    samples = []
    for index in range(drops + 1):
        forge.clear_requests()
        ref = f"b{index}-{time.monotonic_ns()}"
        start = drop(run.inbox("bravo"), f"{ref}.json", {"batch_ref": ref, "tasks": make_tasks(1)})
        wait_until(lambda: created(forge.requests("/eval-bravo-")) >= 1, pause=0.01)
        took = time.perf_counter() - start
        if busy and all(run.opened(batch_id) for batch_id in busy):
            raise RuntimeError("A's batches were all open before B's drop ended: make them larger")
        if index:
            samples.append(took)
    return samples


def block(forge: ForgeProcess, args: argparse.Namespace, busy: bool) -> list[float]:
    """One block with a fresh service: B's drops, with A's backlog when `busy`."""
    with running(forge, ["alpha", "bravo"]) as run:
        opening: list[str] = []
        if busy:
            for n in range(args.a_batches):
                name = f"a{n}.json"
                tasks = make_tasks(args.a_tasks, f"a{n}-")
                drop(run.inbox("alpha"), name, {"batch_ref": f"a{n}", "tasks": tasks})
                opening.append(run.batch_id("alpha", name))
            forge.clear_requests()
            wait_until(lambda: created(forge.requests("/eval-alpha-")) >= 50, pause=0.05)
        return b_drops(run, forge, args.drops, opening)


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=10)
    args_parser.add_argument("--rounds", type=int, default=2)
    args_parser.add_argument("--a-batches", type=int, default=4)
    args_parser.add_argument("--a-tasks", type=int, default=1500)
    forge_arguments(args_parser)
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = args_parser.parse_args()
    if args.quick:
        args.drops, args.rounds, args.a_batches, args.a_tasks = 4, 1, 2, 600
    started = time.perf_counter()
    quiet: list[float] = []
    busy: list[float] = []
    with ForgeProcess(capacity=args.capacity, delay=args.delay) as forge:
        for _ in range(args.rounds):  # alternating blocks: drift in the load hits both
            quiet += block(forge, args, busy=False)
            busy += block(forge, args, busy=True)
    base, loaded = percentile(quiet, 50), percentile(busy, 50)
    result = BenchResult("fairness", command_line())
    result.add(
        "B's one-task drop -> issue, A idle: p50",
        base * 1000,
        "ms",
        note=f"baseline; p95 {percentile(quiet, 95) * 1000:.0f} ms",
    )
    result.add(
        "the same while A's batches are taken in: p50",
        loaded * 1000,
        "ms",
        note=f"p95 {percentile(busy, 95) * 1000:.0f} ms",
    )
    ratio = loaded / base
    result.add("busy / quiet (p50)", ratio, "x", f"<= {TARGET}", ratio <= TARGET)
    result.info["setup"] = (
        f"{len(quiet)} + {len(busy)} drops by B in {args.rounds} rounds of a quiet and a busy "
        f"block (each a fresh service, default settings); A: {args.a_batches} batches x "
        f"{args.a_tasks} tasks; {forge_note(args)}; one repo per batch"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
