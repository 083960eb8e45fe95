"""A drop path near the disk's limit: the product's one-task drops against the disk's own
limit and against a raw `requests` loop making the same forge calls, in one run.

1. The disk's limit: `--writers` threads doing the minimal durable write of a drop
   (write a temp file, fsync it, rename it into place, fsync the folder) into a folder
   beside the service's state; drops/s.
2. The product: `--drops` one-task drops from `--clients` clients renamed at once into a
   running service's inbox (default settings) against a forge in its own process with no
   delay; drops/s from the first rename until the last receipt, and until the forge
   answered 201 to the last issue. While the burst runs, `os.fsync`/`os.fdatasync` and
   `os.replace`/`os.rename` are counted per thread (the inbox pool's threads are the way to
   the receipt; the opener's the issues), and the process's CPU time (the forge is in
   another process): per drop.
3. The raw loop: `--raw-threads` threads each making a drop's forge calls with requests
   (one repo per batch: repo + label + issue; shared: the repo and label once, then the
   issue), against a fresh forge of the same kind; drops/s.

Each for one repo per batch and a shared repo (SAAS_EVAL_REPO). Beside the service's CPU
a drop: its user and system parts, the context switches, the intake threads' share and the
store lock's share of the burst (_anatomy.py); `--anatomy` adds the intake path alone, to
its receipts with no issue opened. Targets: product / raw
loop >= 0.8 (per-batch) and >= 0.5 (shared); fsyncs per drop to the receipt <= 3. With
`--postgres` the service's store is a private, durable PostgreSQL cluster (bench/_pgserver.py,
on the same disk) instead of the state folder: the fsyncs counted are then the service's
own (its files), the database's are its server's.

    python bench/disk.py [--drops 500] [--clients 50] [--writers 4] [--raw-threads 8]
                         [--postgres] [--anatomy] [--quick] [--json]
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _anatomy import Anatomy, describe, issues_off, machine_busy, watching
from _common import BenchResult, command_line, emit, make_tasks, parser
from _forge import ForgeProcess
from _pgserver import durable_cluster, server_note
from _raw import thread_sessions
from _service import created, rename_in, running, wait_until, write_part

from dropbox_eval.forge.markers import issue_body
from dropbox_eval.inbox import Inbox, fsops
from dropbox_eval.intake.opening import LABEL_COLOR
from dropbox_eval.models import TaskSpec

PER_BATCH_TARGET = 0.8
SHARED_TARGET = 0.5
FSYNC_TARGET = 3.0
DROP_BYTES = 600  # about a one-task drop's state


@dataclass
class Disk:
    """The fsync loop: its writes/s and the CPU seconds a write."""

    rate: float
    cpu: float


def fsync_loop(folder: Path, writers: int, drops: int) -> Disk:
    """Drops/s of `writers` threads each writing files durably: temp, fsync, rename, fsync
    the folder (the least a durable drop costs), and the CPU seconds each write cost (this
    process's, nearly all the kernel's)."""
    payload = os.urandom(DROP_BYTES)
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)

    def write(n: int) -> None:
        tmp, name = f".w{n}.tmp", f"w{n}.json"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=folder_fd)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        os.fsync(folder_fd)

    try:
        start, cpu = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(max_workers=writers) as pool:
            list(pool.map(write, range(drops)))
        return Disk(drops / (time.perf_counter() - start), (time.process_time() - cpu) / drops)
    finally:
        os.close(folder_fd)


_phase = threading.local()  # an intake thread's drop: before or after its move


@dataclass
class Syscalls:
    """fsyncs and renames counted per kind while active (`counting`): `receipt` (an
    intake thread, up to the first fsync after the drop's move, which makes the receipt
    durable), `filing` (after that: the inbox folder), `issues` (the opener, the forge
    worker), `bench` (this script's own thread)."""

    fsyncs: Counter[str] = field(default_factory=Counter)
    renames: Counter[str] = field(default_factory=Counter)

    def kind(self, fsync: bool) -> str:
        name = threading.current_thread().name
        if name == "MainThread":
            return "bench"
        if name.startswith(("open", "intake", "forge")):
            return "issues"
        moved = getattr(_phase, "moved", 0)
        if fsync and moved == 1:
            _phase.moved = 2
            return "receipt"
        return "filing" if moved == 2 else "receipt"


@contextmanager
def counting() -> Iterator[Syscalls]:
    """Wrap os.fsync, os.fdatasync, os.replace and os.rename (measurement only)."""
    counts = Syscalls()
    lock = threading.Lock()
    saved = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace", "rename")}

    def wrap(name: str, table: Counter[str]) -> Callable[..., Any]:
        real = saved[name]

        def counted(*args: Any, **kwargs: Any) -> Any:
            with lock:
                table[counts.kind(table is counts.fsyncs)] += 1
            return real(*args, **kwargs)

        return counted

    real_move, real_process = fsops.move_opened, Inbox.process

    def move(*args: Any) -> bool:
        moved = real_move(*args)
        _phase.moved = 1
        return moved

    def process(inbox: Inbox, path: Path) -> Any:
        _phase.moved = 0
        return real_process(inbox, path)

    fsops.move_opened = move  # type: ignore[assignment]
    Inbox.process = process  # type: ignore[method-assign]
    for name in ("fsync", "fdatasync"):
        setattr(os, name, wrap(name, counts.fsyncs))
    for name in ("replace", "rename"):
        setattr(os, name, wrap(name, counts.renames))
    try:
        yield counts
    finally:
        for name, real in saved.items():
            setattr(os, name, real)
        fsops.move_opened, Inbox.process = real_move, real_process  # type: ignore[method-assign]


@dataclass
class Burst:
    """One product burst."""

    drops: int
    to_receipts: float
    to_issues: float
    cpu: float
    calls: Syscalls
    anatomy: Anatomy | None = None

    def per_drop(self, table: Counter[str], *kinds: str) -> float:
        """Calls of `kinds` (all but the bench's own when none) per drop."""
        chosen = kinds or ("receipt", "filing", "issues")
        return sum(table[kind] for kind in chosen) / self.drops


def receipts(folders: list[Path]) -> int:
    """Receipts filed so far in the clients' `accepted/` folders."""
    total = 0
    for folder in folders:
        with suppress(FileNotFoundError):
            names = (e.name for e in os.scandir(folder / "accepted"))
            total += sum(1 for name in names if name.endswith(".receipt.json"))
    return total


def product(
    drops: int, clients: int, shared: bool, database: str | None = None, *, issues: bool = True
) -> Burst:
    """`drops` one-task drops renamed at once into a running service's inbox (its store
    on `database` when given), timed to the last issue; without `issues`, to the last
    receipt, no issue opened. Where the time goes is taken too (_anatomy.py)."""
    names = [f"c{n:03d}" for n in range(clients)]
    with ForgeProcess() as forge:
        extra: dict[str, Any] = {"repo": f"{forge.user}/shared-disk"} if shared else {}
        if database is not None:
            extra["database_url"] = database
        off = contextlib.nullcontext() if issues else issues_off()  # before the service binds it
        with off, running(forge, names, **extra) as run:
            folders = [run.inbox(name) for name in names]
            parts = [
                write_part(
                    folders[i % clients],
                    f"d{i}.json",
                    {"batch_ref": f"d{i}", "tasks": make_tasks(1, f"d{i}-")},
                )
                for i in range(drops)
            ]
            forge.clear_requests()
            with counting() as calls, watching() as anatomy:
                cpu = time.process_time()
                start = min(rename_in(part) for part in parts)
                wait_until(lambda: receipts(folders) >= drops, pause=0.05)
                to_receipts = to_issues = time.perf_counter() - start
                if issues:
                    wait_until(lambda: created(forge.requests("/issues")) >= drops, pause=0.25)
                    to_issues = time.perf_counter() - start
                cpu = time.process_time() - cpu
    return Burst(drops, to_receipts, to_issues, cpu, calls, anatomy)


@dataclass
class Raw:
    """The raw loop: its drops/s, and the machine's CPU seconds a drop (client and forge)."""

    rate: float
    machine_cpu: float
    client_cpu: float  # this process's (the requests loop's) share of it


def raw_drops(drops: int, threads: int, shared: bool) -> Raw:
    """Drops/s of a requests loop making each drop's forge calls (per-batch: repo, label,
    issue; shared: the repo and label once, then an issue per drop)."""
    with ForgeProcess() as forge:
        api = f"{forge.url}/api/v1"
        session = thread_sessions(forge)

        def prepare(repo: str) -> int:
            made = session().post(f"{api}/user/repos", json={"name": repo, "private": True})
            made.raise_for_status()
            label = session().post(
                f"{api}/repos/{forge.user}/{repo}/labels",
                json={"name": "eval-task", "color": LABEL_COLOR},
            )
            label.raise_for_status()
            return int(label.json()["id"])

        shared_label = prepare("shared-raw") if shared else 0

        def one(n: int) -> None:
            task = make_tasks(1, f"d{n}-")[0]
            repo = "shared-raw" if shared else f"raw-{n}"
            label = shared_label if shared else prepare(repo)
            body = issue_body("raw", TaskSpec.model_validate(task))
            session().post(
                f"{api}/repos/{forge.user}/{repo}/issues",
                json={"title": task["title"], "body": body, "labels": [label]},
            ).raise_for_status()

        start, client, busy = time.perf_counter(), time.process_time(), machine_busy()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(drops)))
        seconds, client = time.perf_counter() - start, time.process_time() - client
        return Raw(drops / seconds, (machine_busy() - busy) / drops, client / drops)


def add_mode(result: BenchResult, mode: str, run: Burst, raw: Raw, disk: Disk) -> None:
    target = PER_BATCH_TARGET if mode == "per-batch" else SHARED_TARGET
    rate = run.drops / run.to_issues
    result.add(
        f"{mode}: product drops/s (rename -> last issue) / raw requests loop",
        rate / raw.rate,
        "x",
        f">= {target}",
        rate / raw.rate >= target,
        note=f"{rate:.1f} vs {raw.rate:.1f} drops/s",
    )
    add_budget(result, mode, run, raw, disk, target)
    receipt_rate = run.drops / run.to_receipts
    result.add(
        f"{mode}: product drops/s (rename -> last receipt) / the disk's fsync loop",
        receipt_rate / disk.rate,
        "x",
        note=f"{receipt_rate:.1f} vs {disk.rate:.1f} drops/s",
    )
    fsyncs = run.per_drop(run.calls.fsyncs, "receipt")
    result.add(
        f"{mode}: fsyncs per drop until its receipt is durable",
        fsyncs,
        "fsyncs",
        f"<= {FSYNC_TARGET:g}",
        fsyncs <= FSYNC_TARGET,
        note=f"renames {run.per_drop(run.calls.renames, 'receipt'):.2f}; the filing after it "
        f"{run.per_drop(run.calls.fsyncs, 'filing'):.2f} fsyncs; the whole drop with its "
        f"issue {run.per_drop(run.calls.fsyncs):.2f} fsyncs, "
        f"{run.per_drop(run.calls.renames):.2f} renames",
    )
    result.add(
        f"{mode}: service CPU per drop (rename -> last issue)",
        run.cpu / run.drops * 1000,
        "ms",
        note=describe(run.anatomy, run.drops),
    )


def add_budget(
    result: BenchResult, mode: str, run: Burst, raw: Raw, disk: Disk, target: float
) -> None:
    """The most CPU a drop may cost the service for the target rate on this machine: its
    cores at that rate, less what the forge spends on the same calls; of it, the raw
    client's own calls and one durable file (the receipt) cannot be saved."""
    cores = os.cpu_count() or 1
    forge = raw.machine_cpu - raw.client_cpu
    budget = cores / (target * raw.rate) - forge
    spent = run.cpu / run.drops
    left = budget - raw.client_cpu - disk.cpu
    result.add(
        f"{mode}: service CPU a drop at most, for the target on {cores} cores",
        budget * 1000,
        "ms",
        note=f"measured {spent * 1000:.1f} ms ({spent / budget:.1f} x); of the budget the "
        f"raw client's calls take {raw.client_cpu * 1000:.1f} ms and one durable file "
        f"{disk.cpu * 1000:.1f} ms, {left * 1000:.1f} ms left to read, check and record a drop",
    )


def add_intake_alone(result: BenchResult, mode: str, run: Burst, raw: Raw) -> None:
    """The intake path alone (no issue opened): its drops/s to the receipts, its CPU."""
    rate = run.drops / run.to_receipts
    result.add(
        f"{mode}: intake alone, no issue opened: drops/s (rename -> last receipt)",
        rate,
        "drops/s",
        note=f"{rate / raw.rate:.2f} x the raw loop; {run.cpu / run.drops * 1000:.1f} ms CPU a "
        f"drop: {describe(run.anatomy, run.drops)}",
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=500)
    args_parser.add_argument("--clients", type=int, default=50)
    args_parser.add_argument("--writers", type=int, default=4)
    args_parser.add_argument("--raw-threads", type=int, default=8)
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args_parser.add_argument(
        "--postgres", action="store_true", help="the store on a private durable PostgreSQL"
    )
    args_parser.add_argument(
        "--anatomy", action="store_true", help="also the intake path alone, no issue opened"
    )
    args = args_parser.parse_args()
    if args.quick:
        args.drops, args.clients = 100, 10
    started = time.perf_counter()
    result = BenchResult("disk", command_line())
    with tempfile.TemporaryDirectory(prefix="bench-disk-") as folder:
        disk = fsync_loop(Path(folder), args.writers, args.drops)
    result.add(
        f"the disk's limit: {args.writers} writers, temp + fsync + rename + fsync folder",
        disk.rate,
        "drops/s",
        note=f"{disk.cpu * 1000:.2f} ms CPU a write (nearly all the kernel's)",
    )
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(durable_cluster()) if args.postgres else None
        for mode, shared in (("per-batch", False), ("shared", True)):
            raw = raw_drops(args.drops, args.raw_threads, shared)
            database = cluster.fresh_url() if cluster is not None else None
            run = product(args.drops, args.clients, shared, database)
            add_mode(result, mode, run, raw, disk)
            if args.anatomy:
                database = cluster.fresh_url() if cluster is not None else None
                alone = product(args.drops, args.clients, shared, database, issues=False)
                add_intake_alone(result, mode, alone, raw)
        if cluster is not None:
            result.info["store"] = server_note(cluster)
    result.info["setup"] = (
        f"{args.drops} one-task drops from {args.clients} clients; forge in its own process "
        f"without delay or capacity, a fresh one per run; raw loop {args.raw_threads} threads; "
        "the service with default settings, clients funded"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
