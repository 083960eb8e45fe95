"""Nodes on PostgreSQL (issue 33): drops/s on one and on two nodes beside TinyDB, and the
time a killed node's lease takes to be taken over by the other.

Every node is `python -m dropbox_eval run` in a process of its own, with its own state
folder, on one shared home (inbox and outbox); the PostgreSQL nodes share one database of
a private cluster started by the bench, durable (fsync, synchronous_commit and
full_page_writes on). The forge is the sandbox in its own process with no delay, its lane
closing each task issue as soon as it sees it (every 0.1 s). The nodes run with default
settings but for SAAS_EVAL_SETTLE_SECONDS=0 (settling is a wait, not work) and
SAAS_EVAL_POLL_INTERVAL=1 (no forge webhook: every node finds results by polling); the
inbox is on local disk, so each node watches it with inotify. No figure has a target:
issue 33 asks for the figures, beside TinyDB's measured in the same run.

1. drops/s, for `tinydb-1` (TinyDB, one node), `pg-1` (PostgreSQL, one node) and `pg-2`
   (PostgreSQL, two nodes), each on a fresh forge, home and schema, in `--rounds` rounds
   in rotating order: `--drops` one-task drops (200) from 4 funded clients are written
   and fsynced as `.part` files before the nodes start, then renamed into place at once;
   the clock runs from the first rename until every receipt exists, and until every report
   is in outbox/ (both polled every 10 ms). Figures: drops/s to receipts and to reports
   for each, and the ratios pg-1 / tinydb-1 and pg-2 / pg-1 (medians over rounds).
2. takeover, two PostgreSQL nodes with SAAS_EVAL_LEASE_SECONDS = each of `--leases` (3,10):
   a one-task drop whose callback goes to a loopback receiver that holds the first POST
   of each batch unanswered (callback timeout 1 h), so the node delivering it holds the
   batch's `deliver` lease; 1 to 1.5 leases after that POST arrived (a seeded draw: the
   kill falls anywhere between two heartbeats), the holder (named by the `leases` row) is
   SIGKILLed, and the row is polled every 50 ms until it names the other node, which the
   receiver answers after 0.5 s. Figures (medians over `--repeats` kills per lease): kill
   -> taken over (on the database's clock: `now()` just before the kill -> the new
   `taken_at`), that minus the lease, the lease's lapse -> taken over (the new `taken_at`
   minus the killed node's last `expires_at`: the takeover's own overhead), and kill ->
   the other node's POST at the receiver. The killed node is started again before the
   next kill. Expected: the heartbeat extends the lease every lease/3 s (on the main
   loop's 1 s tick), so at a kill it has 2/3 to all of a lease to run, and the other
   node's delivery pass looks every second (TICK_SECONDS).

    python bench/nodes.py [--drops 200] [--rounds 2] [--leases 3,10] [--repeats 5]
                          [--quick] [--json]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _common import BenchResult, command_line, emit, make_tasks, parser
from _forge import ForgeProcess
from _nodeproc import LIMIT, NodeProcess, fund, started
from _pgserver import Cluster, durable_cluster, server_note
from _service import FUNDS, wait_until
from _takeover import Takeover, takeovers

CLIENTS = ["c1", "c2", "c3", "c4"]
CONFIGS = {"tinydb-1": (False, 1), "pg-1": (True, 1), "pg-2": (True, 2)}  # (pg, nodes)
NODE_SETTINGS: dict[str, object] = {"settle_seconds": 0, "poll_interval": 1}


@dataclass
class DropRun:
    """One configuration's run: seconds from the first rename to the last receipt and to
    the last report, and the drops each node accepted."""

    receipts: float
    reports: float
    shares: dict[str, int]


def parts(inbox: Path, count: int) -> list[Path]:
    """`count` one-task drops, clients in turn, written and fsynced as `.part` files."""
    found = []
    for index in range(count):
        client = CLIENTS[index % len(CLIENTS)]
        document = {"batch_ref": f"r{index}", "tasks": make_tasks(1, f"d{index}-")}
        part = inbox / client / f"d{index:04}.json.part"
        with open(part, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(document))
            handle.flush()
            os.fsync(handle.fileno())
        found.append(part)
    return found


def counted(folder: Path, pattern: str) -> int:
    """Files under `folder` matching `pattern`."""
    return sum(1 for _ in folder.glob(pattern))


def awaited(done: Callable[[], bool], home: Path, nodes: list[NodeProcess]) -> None:
    """Wait until `done()`; past LIMIT, the home is kept (copied beside it) and the error
    names it, with the counts and each node's last warnings."""
    try:
        wait_until(done, LIMIT, 0.01)
    except RuntimeError:
        kept = Path(tempfile.mkdtemp(prefix="bench-nodes-failed-"))
        shutil.copytree(home, kept, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
        counts = (
            f"receipts {counted(home / 'inbox', '*/accepted/*.receipt.json')}, reports "
            f"{counted(home / 'outbox', '*.json')}"
        )
        warned = [
            f"{node.name}: {line}"
            for node in nodes
            for line in node.tail(10**9).splitlines()
            if " WARNING " in line or " ERROR " in line or "Traceback" in line
        ]
        raise RuntimeError(
            f"not done within {LIMIT:.0f} s ({counts}); home kept in {kept}; "
            + "\n".join(warned[-20:])
        ) from None


def drop_run(cluster: Cluster, config: str, count: int) -> DropRun:
    """`count` one-task drops renamed into place at once, on a fresh forge and home (and
    schema, on PostgreSQL): seconds until every receipt and every report exists."""
    pg, many = CONFIGS[config]
    with (
        ForgeProcess(lane_delay=0.0) as forge,
        tempfile.TemporaryDirectory(prefix="bench-nodes-") as folder,
    ):
        home = Path(folder)
        url = cluster.fresh_url() if pg else None
        nodes = [NodeProcess(home, name, forge, url, **NODE_SETTINGS) for name in "ab"[:many]]
        fund(home / "setup" if pg else nodes[0].state_dir, url, CLIENTS, FUNDS)
        inbox, outbox = home / "inbox", home / "outbox"
        for client in CLIENTS:
            (inbox / client).mkdir(parents=True)
        files = parts(inbox, count)
        with started(nodes):
            start = time.perf_counter()
            for part in files:
                os.rename(part, part.with_suffix(""))
            receipts = "*/accepted/*.receipt.json"
            awaited(lambda: counted(inbox, receipts) >= count, home, nodes)
            to_receipts = time.perf_counter() - start
            awaited(lambda: counted(outbox, "*.json") >= count, home, nodes)
            to_reports = time.perf_counter() - start
        found = (
            counted(inbox, receipts),
            counted(outbox, "*.json"),
            counted(inbox, "*/rejected/*"),
        )
        if found != (count, count, 0):
            raise RuntimeError(f"{config}: receipts, reports, rejected {found} for {count} drops")
        shares = {node.node_id: node.tail(10**9).count(": accepted as batch") for node in nodes}
    return DropRun(to_receipts, to_reports, shares)


def rotated(names: list[str], shift: int) -> list[str]:
    """`names` starting at index `shift` (each round starts with another configuration)."""
    shift %= len(names)
    return names[shift:] + names[:shift]


def report_drops(result: BenchResult, runs: dict[str, list[DropRun]], count: int) -> None:
    """Drops/s per configuration (to receipts, to reports) and the ratios between them."""
    rates: dict[tuple[str, str], float] = {}
    for config, done in runs.items():
        for stage in ("receipts", "reports"):
            seconds = [getattr(run, stage) for run in done]
            rate = count / statistics.median(seconds)
            rates[config, stage] = rate
            shares = "; ".join(
                "/".join(str(v) for v in run.shares.values()) for run in done if len(run.shares) > 1
            )
            note = "rename -> every " + ("receipt" if stage == "receipts" else "report in outbox/")
            note += ": " + ", ".join(f"{s:.2f} s" for s in seconds)
            if shares and stage == "receipts":
                note += f"; drops taken by node a/b: {shares}"
            result.add(f"{config}: drops/s to {stage}", rate, "/s", note=note)
    for stage in ("receipts", "reports"):
        for top, base in (("pg-1", "tinydb-1"), ("pg-2", "pg-1")):
            if (top, stage) in rates and (base, stage) in rates:
                ratio = rates[top, stage] / rates[base, stage]
                result.add(f"drops/s to {stage}: {top} / {base}", ratio, "x")


def report_takeovers(result: BenchResult, lease: float, samples: list[Takeover]) -> None:
    """Medians of one lease's kills, each value listed beside."""

    def listed(values: list[float]) -> str:
        return ", ".join(f"{value:.2f}" for value in values)

    name = f"pg-2, lease {lease:g} s"
    taken = [s.taken for s in samples]
    result.add(
        f"{name}: kill -> lease taken over",
        statistics.median(taken),
        "s",
        note=f"database clock: {listed(taken)}; polled every 50 ms: "
        + listed([s.polled for s in samples]),
    )
    over = [t - lease for t in taken]
    result.add(
        f"{name}: taken over - lease",
        statistics.median(over),
        "s",
        note=f"{listed(over)}; the lease had {listed([s.left_at_kill for s in samples])} s "
        "to run at the kill (its holder's last beat came before)",
    )
    lapse = [s.lapse_to_take for s in samples]
    result.add(
        f"{name}: lease lapsed -> taken over",
        statistics.median(lapse),
        "s",
        note=f"database clock: {listed(lapse)} (the other node's delivery pass: every 1 s)",
    )
    delivered = [s.delivered for s in samples]
    result.add(
        f"{name}: kill -> the other node's callback POST",
        statistics.median(delivered),
        "s",
        note=listed(delivered),
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=200)
    args_parser.add_argument("--rounds", type=int, default=2)
    args_parser.add_argument("--leases", default="3,10", help="lease seconds, comma-separated")
    args_parser.add_argument("--repeats", type=int, default=5, help="kills per lease")
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = args_parser.parse_args()
    if args.quick:
        args.drops, args.rounds, args.leases, args.repeats = 40, 1, "3", 2
    leases = [float(value) for value in args.leases.split(",") if value]
    started_at = time.perf_counter()
    result = BenchResult("nodes", command_line())
    with durable_cluster() as cluster:
        runs: dict[str, list[DropRun]] = {config: [] for config in CONFIGS}
        for index in range(args.rounds):
            for config in rotated(list(CONFIGS), index):
                runs[config].append(drop_run(cluster, config, args.drops))
        report_drops(result, runs, args.drops)
        for lease in leases:
            report_takeovers(
                result, lease, takeovers(cluster, lease, args.repeats, **NODE_SETTINGS)
            )
        result.info["database"] = server_note(cluster)
    result.info["setup"] = (
        f"{args.drops} one-task drops from {len(CLIENTS)} funded clients renamed at once, "
        f"{args.rounds} round(s) in rotating order; takeover: {args.repeats} kills per lease. "
        "Each node is `python -m dropbox_eval run` in its own process (own state folder, "
        "shared home), default settings but SAAS_EVAL_SETTLE_SECONDS=0 and "
        "SAAS_EVAL_POLL_INTERVAL=1 (inotify on the local inbox); sandbox forge in its own "
        "process, no delay, its lane closing each issue at once (looked at every 0.1 s); "
        "one repo per batch"
    )
    result.seconds = time.perf_counter() - started_at
    emit(result, args.json)


if __name__ == "__main__":
    main()
