"""Fairness at the inbox and at the API: client B's one-task drop -> its receipt while other
clients' drops flood the inbox, and B's one-task API post -> its answer while client A's
posts flood the API, each against the same with the door quiet, in the same run.

Blocks alternate, each with a fresh service (default settings: 4 inbox workers, quiet
period 1 s, backlog 1,000 per client) on one sandbox forge in its own process (no delay):

- quiet: B drops `--drops` one-task batches one after another (written to `.part`, fsynced,
  renamed into place), nobody else dropping;
- a flood, then the same drops by B, each started while the flood still waits in the
  inbox (the block ends when it has drained):
  - `one`: client A drops `--flood` one-task batches (300);
  - `invalid`: A drops `--invalid` files that are not JSON (600);
  - `many`: `--clients` clients (30) drop `--flood / --clients` one-task batches each;
- at the API (`POST /api/eval/batches`, the service's HTTP API on loopback): `api-quiet`, B
  posts one-task batches one after another; `api`, A sends `--flood` one-task posts at once
  from a process of its own (300 threads, each posting again after `Retry-After` when the
  door answers 429), and B posts while some of them still wait at the door.

The figure is B's rename -> receipt written (at the API: the post sent -> its 201), p50
under each flood / p50 quiet. Target (issue 31): at most 2 times quiet, or quiet + 0.5 s
(quiet + 1.5 s under `many`). Each block starts with a warm-up drop (or post) by B, before
any flood.

    python bench/inbox_fairness.py [--drops 8] [--rounds 2] [--flood 300] [--invalid 600]
                                   [--clients 30] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path

from _api_flood import flood_result, post, start_flood
from _common import BenchResult, command_line, emit, make_tasks, parser, percentile
from _forge import ForgeProcess
from _service import Running, drop, running, wait_until

from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api

FLOODS = ("one", "invalid", "many")
API_BLOCKS = ("api-quiet", "api")
ALLOWANCE = {"one": 0.5, "invalid": 0.5, "many": 1.5, "api": 0.5}  # s above quiet allowed


def flood_clients(kind: str, args: argparse.Namespace) -> list[str]:
    """The clients that flood the inbox in a block of `kind` (none when quiet)."""
    if kind == "many":
        return [f"c{n:02}" for n in range(args.clients)]
    return ["alpha"] if kind in FLOODS else []


def pour(run: Running, kind: str, args: argparse.Namespace) -> list[Path]:
    """Rename the flood's files into place as fast as they can be written; their paths."""
    clients = flood_clients(kind, args)
    count = args.invalid if kind == "invalid" else args.flood
    paths = []
    for index in range(count):
        folder = run.inbox(clients[index % len(clients)])
        part = folder / f"f{index:05}.json.part"
        if kind == "invalid":
            part.write_text("{not json")
        else:
            part.write_text(json.dumps({"tasks": make_tasks(1, f"f{index}-")}))
        os.rename(part, part.with_suffix(""))
        paths.append(part.with_suffix(""))
    return paths


def b_drop(run: Running) -> float:
    """One drop by B: its rename -> its receipt, in seconds."""
    ref = f"b{time.monotonic_ns()}"
    name = f"{ref}.json"
    start = drop(run.inbox("bravo"), name, {"batch_ref": ref, "tasks": make_tasks(1)})
    wait_until(functools.partial(run.receipt, "bravo", name), pause=0.002)
    return time.perf_counter() - start


def block(forge: ForgeProcess, kind: str, args: argparse.Namespace) -> list[float]:
    """One block with a fresh service: a warm-up drop by B, then a flood of `kind` (or
    none), then B's drops one at a time, each started while some of the flood still waits
    (the block ends when it has drained)."""
    with running(forge, ["bravo", *flood_clients(kind, args)]) as run:
        b_drop(run)
        flood = pour(run, kind, args) if kind in FLOODS else []
        samples = []
        for _ in range(args.drops):
            if flood and not any(path.exists() for path in flood):
                break
            samples.append(b_drop(run))
        if not samples:
            raise RuntimeError("the flood drained before B's first drop: make it larger")
        return samples


def b_post(url: str, key: str) -> float:
    """One post by B: sent -> its 201, in seconds."""
    start = time.perf_counter()
    status, _, body = post(
        url, key, {"batch_ref": f"b{time.monotonic_ns()}", "tasks": make_tasks(1)}
    )
    if status != 201:
        raise RuntimeError(f"B's post answered {status}: {body[:200]!r}")
    return time.perf_counter() - start


def api_block(forge: ForgeProcess, kind: str, args: argparse.Namespace) -> list[float]:
    """One block at the API with a fresh service: a warm-up post by B, then (`api`) A's
    flood, and B's posts one at a time while some of A's still wait at the door."""
    with running(forge, ["bravo", "alpha"]) as run:
        web = create_api(run.product.web)
        server = BackgroundServer(web, name="bench-api")
        url = server.start()
        door = web.state.door
        try:
            bravo, alpha = (run.product.billing.new_api_key(c) for c in ("bravo", "alpha"))
            b_post(url, bravo)
            flood = start_flood(url, alpha, args.flood) if kind == "api" else None
            if flood is not None:  # A's share of the door is full: the flood waits there
                full = min(args.flood, run.product.settings.api_client_backlog)
                wait_until(lambda: door.held().get("alpha", 0) >= full, pause=0.002)
            samples = []
            for _ in range(args.drops):
                if flood is not None and not door.held().get("alpha"):
                    break
                samples.append(b_post(url, bravo))
            if flood is not None:
                outcome = flood_result(flood)
                REFUSED.append(outcome["refused"])
        finally:
            server.stop()
    if not samples:
        raise RuntimeError("the API flood drained before B's first post: make it larger")
    return samples


REFUSED: list[int] = []  # A's posts answered 429 (sent again after Retry-After), per flood


def report(
    result: BenchResult,
    samples: dict[str, list[float]],
    baseline: str,
    floods: tuple[str, ...],
    title: str,
) -> None:
    """B's p50 with the door quiet (`baseline`), then under each of `floods` against it."""
    quiet = percentile(samples[baseline], 50)
    note = f"baseline; p95 {percentile(samples[baseline], 95) * 1000:.0f} ms"
    result.add(f"{title}: p50", quiet * 1000, "ms", note=note)
    for kind in floods:
        loaded = percentile(samples[kind], 50)
        limit = max(2 * quiet, quiet + ALLOWANCE[kind])
        result.add(
            f"the same under the `{kind}` flood: p50",
            loaded * 1000,
            "ms",
            f"<= {limit * 1000:.0f} ms",
            loaded <= limit,
            note=(
                f"x{loaded / quiet:.1f} quiet; p95 {percentile(samples[kind], 95) * 1000:.0f} "
                f"ms; {len(samples[kind])} samples"
            ),
        )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=8)
    args_parser.add_argument("--rounds", type=int, default=2)
    args_parser.add_argument("--flood", type=int, default=300)
    args_parser.add_argument("--invalid", type=int, default=600)
    args_parser.add_argument("--clients", type=int, default=30)
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = args_parser.parse_args()
    if args.quick:
        args.drops, args.rounds, args.flood, args.invalid, args.clients = 3, 1, 150, 300, 10
    started = time.perf_counter()
    samples: dict[str, list[float]] = {kind: [] for kind in ("quiet", *FLOODS, *API_BLOCKS)}
    with ForgeProcess() as forge:
        for _ in range(args.rounds):  # alternating blocks: drift in the load hits all
            for kind in samples:
                take = api_block if kind in API_BLOCKS else block
                samples[kind] += take(forge, kind, args)
    result = BenchResult("inbox_fairness", command_line())
    report(result, samples, "quiet", FLOODS, "B's one-task drop -> receipt, inbox quiet")
    report(result, samples, "api-quiet", ("api",), "B's one-task API post -> 201, API quiet")
    result.info["setup"] = (
        f"up to {args.drops} drops by B per block in {args.rounds} rounds of 6 "
        f"blocks (each a fresh service, default settings); floods: `one` {args.flood} "
        f"one-task drops by A, `invalid` {args.invalid} invalid files by A, `many` "
        f"{args.flood} one-task drops by {args.clients} clients, `api` {args.flood} one-task "
        f"API posts by A at once ({sum(REFUSED)} answers 429 in all, each sent again after "
        "Retry-After); sandbox forge in its own process, no delay; one repo per batch"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
