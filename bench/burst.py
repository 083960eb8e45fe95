"""A burst of one-task drops: how much of the forge's capacity the product turns into drops.

The forge runs in its own process (`--delay` s per request, at most `--capacity` served at
once: see flow.py). In one run: the forge's capacity in requests/s is measured first (the
raw loop's best throughput over `--sweep` thread counts), then `--drops` one-task batch
files, spread round robin over `--clients` clients, are written as `.part` and renamed
into the running service's inbox (default settings) one after another. The clock runs
from the first rename until the forge has answered 201 to the last issue; the forge's
request log gives the round trips per drop (every API request during the burst / drops).

Figure: drops/s / (capacity in requests/s / round trips per drop), target >= 0.7; for one
repo per batch (3 round trips: repo, label, issue) and a shared repo (SAAS_EVAL_REPO: the
repo and label once, then 1), and, for context, the same burst from one client, and the
shared burst against a forge without delay or capacity (what the drop path alone allows).

    python bench/burst.py [--drops 500] [--clients 50] [--single-drops 100] [--delay 0.1]
                          [--capacity 16] [--sweep 12,16,24,32] [--quick] [--json]
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from _common import BenchResult, command_line, emit, make_tasks, parser
from _forge import ForgeProcess, forge_arguments, forge_note
from _raw import best, knee, sweep_note
from _service import created, rename_in, running, wait_until, write_part

TARGET = 0.7


@dataclass
class Burst:
    """One burst: its size, its time, and the forge's log while it ran."""

    drops: int
    seconds: float
    log: list[dict[str, Any]]

    @property
    def rate(self) -> float:
        """Drops per second, first rename -> last issue created."""
        return self.drops / self.seconds

    @property
    def trips(self) -> float:
        """API requests per drop."""
        return len(self.log) / self.drops

    def kinds(self) -> str:
        """The requests of the burst by method and kind of path, most frequent first."""
        counted = Counter(f"{e['method']} {_kind(e['path'])}" for e in self.log)
        return ", ".join(f"{n} {kind}" for kind, n in counted.most_common(6))


def _kind(path: str) -> str:
    parts = path.removeprefix("/api/v1/").split("/")
    if parts[0] == "repos" and len(parts) > 3:
        return "repos/*/*/" + "/".join("N" if p.isdigit() else p for p in parts[3:])
    return "/".join(parts)


def burst(forge: ForgeProcess, drops: int, clients: int, shared: bool) -> Burst:
    """`drops` one-task drops renamed into a running service's inbox at once."""
    names = [f"c{n:03d}" for n in range(clients)]
    extra: dict[str, Any] = {"repo": f"{forge.user}/shared-burst"} if shared else {}
    with running(forge, names, **extra) as run:
        parts = [
            write_part(
                run.inbox(names[i % clients]),
                f"d{i}.json",
                {"batch_ref": f"d{i}", "tasks": make_tasks(1, f"d{i}-")},
            )
            for i in range(drops)
        ]
        forge.clear_requests()
        start = min(rename_in(part) for part in parts)
        # the log is fetched and parsed in the service's own process: every 0.25 s, not
        # 0.05 s, so the watching does not take the drop path's CPU (the end is late by at
        # most 0.25 s of a burst of tens of seconds)
        wait_until(lambda: created(forge.requests("/issues")) >= drops, pause=0.25)
        seconds = time.perf_counter() - start
        log = forge.requests()
    return Burst(drops, seconds, log)


def add_figure(result: BenchResult, label: str, run: Burst, capacity: float) -> None:
    """The burst's rate against the forge's capacity in drops/s."""
    ceiling = capacity / run.trips
    ratio = run.rate / ceiling
    result.add(
        f"{label}: drops/s / forge capacity in drops/s",
        ratio,
        "x",
        f">= {TARGET}",
        ratio >= TARGET,
        note=f"{run.rate:.1f} drops/s ({run.drops} in {run.seconds:.1f} s) vs "
        f"{capacity:.0f} requests/s / {run.trips:.2f} round trips = {ceiling:.1f} drops/s; "
        f"requests: {run.kinds()}",
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=500)
    args_parser.add_argument("--clients", type=int, default=50)
    args_parser.add_argument("--single-drops", type=int, default=100)
    forge_arguments(args_parser)
    args_parser.add_argument("--sweep", default="12,16,24,32")
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = args_parser.parse_args()
    if args.quick:
        args.drops, args.clients, args.single_drops, args.sweep = 100, 10, 20, "16,32"
    started = time.perf_counter()
    result = BenchResult("burst", command_line())
    with ForgeProcess(capacity=args.capacity, delay=args.delay) as forge:
        sweep = knee(
            forge,
            make_tasks(480 if not args.quick else 160),
            [int(n) for n in args.sweep.split(",")],
        )
        capacity = best(sweep).rate
        result.add(
            "forge capacity: the raw loop's best throughput",
            capacity,
            "requests/s",
            note=f"sweep {sweep_note(sweep)}",
        )
        many = f"{args.drops} drops from {args.clients} clients"
        add_figure(
            result, f"{many}, per-batch", burst(forge, args.drops, args.clients, False), capacity
        )
        add_figure(
            result, f"{many}, shared", burst(forge, args.drops, args.clients, True), capacity
        )
        single = burst(forge, args.single_drops, 1, False)
        add_figure(result, f"{args.single_drops} drops from 1 client, per-batch", single, capacity)
    with ForgeProcess() as instant:  # no delay, no capacity: what the drop path alone allows
        alone = burst(instant, args.drops, args.clients, True)
    result.add(
        f"{many}, shared, forge without delay or capacity (context)",
        alone.rate,
        "drops/s",
        note=f"{alone.drops} in {alone.seconds:.1f} s: the product's own drop path, the forge "
        "out of the way",
    )
    result.info["setup"] = (
        f"{forge_note(args)}; the service with default settings (price 1, clients funded), "
        "a fresh one for every burst"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
