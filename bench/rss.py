"""Peak RSS of the service while it tracks 100,000 tasks (10 batches x 10,000).

The sandbox forge runs in this (parent) process; the product runs in a child process whose
peak RSS (VmHWM, = ru_maxrss) is read after: intake of every batch through the product,
the lane closing 100 issues per batch, one service poll cycle (the periodic full poll,
cycle 1) and one incremental cycle. Baseline: a child that only imports the package.
Then the same with 5 x 4,000 tasks, once with one repo per batch and once with a shared
repo: how much the two poll cycles raise the peak over the RSS before them (VmHWM reset by
`/proc/self/clear_refs`).

    python bench/rss.py [--batches 10] [--tasks 10000] [--closed 100]
                        [--cycle-batches 5] [--cycle-tasks 4000] [--json]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from _common import (
    BenchResult,
    Stopwatch,
    command_line,
    emit,
    make_tasks,
    parser,
    rss_kib,
    settings_for,
)

if TYPE_CHECKING:  # the children must not import the sandbox (FastAPI, uvicorn)
    from dropbox_eval.sandbox import SandboxForge

TARGET_MB = 300.0


def child_baseline() -> dict[str, Any]:
    """Import everything the service uses, nothing else."""
    import dropbox_eval.cli
    import dropbox_eval.service  # noqa: F401

    peak, current = rss_kib()
    return {
        "peak_kib": peak,
        "rss_kib": current,
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def child_service(
    url: str, token: str, user: str, batches: int, tasks: int, shared: bool
) -> dict[str, Any]:
    """Take the batches in, wait for the lane (parent), run two poll cycles; report RSS."""
    from dropbox_eval.app import build_app, service_for

    out: dict[str, Any] = {"after_batch_kib": []}
    extra = {"repo": f"{user}/rss-{time.monotonic_ns()}"} if shared else {}
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as home:
        app = build_app(settings_for(home, url, token, user, poll_interval=3600, **extra))
        app.billing.add_client("bench", 0)
        repos: list[str] = []
        with Stopwatch() as intake:
            for index in range(batches):
                result = app.intake.submit_batch("bench", make_tasks(tasks, f"b{index}-"))
                assert result["ok"] and all(i["issue_number"] for i in result["issues"])
                repos.append(app.store.get_batch(result["batch_id"]).repo)
                out["after_batch_kib"].append(rss_kib()[0])
        out["intake_s"] = intake.seconds
        print(json.dumps({"repos": repos}), flush=True)
        sys.stdin.readline()  # the parent's lane closed some issues
        service = service_for(app)
        out["before_cycles_kib"] = reset_peak()
        with Stopwatch() as full:
            service.poll_cycle()
        out["full_cycle_s"] = full.seconds
        out["after_full_cycle_kib"] = rss_kib()[0]
        with Stopwatch() as incremental:
            service.poll_cycle()
        out["incremental_cycle_s"] = incremental.seconds
        out["cycles_peak_kib"] = rss_kib()[0]
        if service.status.get("last_error"):
            raise RuntimeError(f"poll cycle failed: {service.status['last_error']}")
        rows = app.store.list_batches()
        out["tracked_tasks"] = sum(int(r["total"]) for r in rows)
        out["finished_tasks"] = sum(int(r["done"]) for r in rows)
    peak, current = rss_kib()
    out.update(
        peak_kib=peak,
        rss_kib=current,
        ru_maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    )
    return out


def reset_peak() -> int:
    """Reset VmHWM to the current RSS (Linux `clear_refs` 5); returns the RSS in KiB."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")
    return rss_kib()[1]


def run_child(
    args: list[str], forge: SandboxForge | None = None, closed: int = 0
) -> dict[str, Any]:
    """Run this script as a child; act as the lane when it reports its repos."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    if forge is not None:
        repos = json.loads(proc.stdout.readline())["repos"]
        for repo in sorted(set(repos)):  # a shared repo holds every batch's issues
            owner, name = repo.split("/", 1)
            for number in range(1, closed * repos.count(repo) + 1):
                forge.finish_issue(
                    owner, name, number, comment="Verdict: pass.", labels=["eval-pass"]
                )
        proc.stdin.write("go\n")
        proc.stdin.flush()
    output, _ = proc.communicate(timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"child failed with {proc.returncode}")
    data: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return data


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-baseline":
        print(json.dumps(child_baseline()))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-service":
        url, token, user, batches, tasks, shared = sys.argv[2:8]
        out = child_service(url, token, user, int(batches), int(tasks), shared == "shared")
        print(json.dumps(out))
        return
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--batches", type=int, default=10)
    args_parser.add_argument("--tasks", type=int, default=10_000)
    args_parser.add_argument("--closed", type=int, default=100)
    args_parser.add_argument("--cycle-batches", type=int, default=5)
    args_parser.add_argument("--cycle-tasks", type=int, default=4000)
    args = args_parser.parse_args()
    from dropbox_eval.sandbox import SandboxForge

    started = time.perf_counter()
    baseline = run_child(["--child-baseline"])
    with SandboxForge(port=0) as forge:

        def service_child(batches: int, tasks: int, mode: str) -> dict[str, Any]:
            child = ["--child-service", forge.url, forge.token, forge.user]
            return run_child([*child, str(batches), str(tasks), mode], forge, args.closed)

        measured = service_child(args.batches, args.tasks, "per-batch")
        growth = {
            mode: service_child(args.cycle_batches, args.cycle_tasks, mode)
            for mode in ("per-batch", "shared")
        }
    total = args.batches * args.tasks
    assert measured["tracked_tasks"] == total
    assert measured["finished_tasks"] == args.batches * args.closed
    peak_mb = measured["peak_kib"] / 1024
    base_mb = baseline["peak_kib"] / 1024
    first_mb = measured["after_batch_kib"][0] / 1024
    result = BenchResult("rss", command_line())
    result.add(
        f"peak RSS tracking {total} tasks",
        peak_mb,
        "MB",
        f"<= {TARGET_MB:.0f} MB",
        peak_mb <= TARGET_MB,
        note=f"VmHWM after intake + full cycle + incremental cycle; ru_maxrss "
        f"{measured['ru_maxrss_kib'] / 1024:.0f} MB",
    )
    result.add("baseline: interpreter + package imported", base_mb, "MB")
    result.add(
        "peak above baseline",
        peak_mb - base_mb,
        "MB",
        note="the store holds one batch in memory at a time: "
        f"{(peak_mb - base_mb) * 1024 * 1024 / args.tasks:.0f} bytes per task of "
        "the largest batch",
    )
    result.add(
        f"peak after the 1st batch ({args.tasks} tasks)",
        first_mb,
        "MB",
        note=f"growth from 1 to all batches: {peak_mb - first_mb:+.0f} MB",
    )
    grown = {
        mode: (data["cycles_peak_kib"] - data["before_cycles_kib"]) / 1024
        for mode, data in growth.items()
    }
    result.add(
        f"RSS growth over two poll cycles, {args.cycle_batches} x {args.cycle_tasks} tasks, "
        "shared repo minus one repo per batch",
        grown["shared"] - grown["per-batch"],
        "MB",
        "<= 5 MB",
        grown["shared"] - grown["per-batch"] <= 5,
        note=f"+{grown['shared']:.1f} MB vs +{grown['per-batch']:.1f} MB (peak during the "
        "cycles over the RSS before them); the issue measured +34 vs +4 MB",
    )
    result.info["phases"] = (
        f"intake of {total} tasks {measured['intake_s']:.0f} s; full cycle "
        f"{measured['full_cycle_s']:.1f} s; incremental cycle "
        f"{measured['incremental_cycle_s']:.1f} s; RSS after the full "
        f"cycle {measured['after_full_cycle_kib'] / 1024:.0f} MB"
    )
    result.info["peak by batch (MB)"] = " ".join(
        f"{kib / 1024:.0f}" for kib in measured["after_batch_kib"]
    )
    result.info["setup"] = (
        "product in a child process, in-process SandboxForge in the parent "
        f"(lane closes {args.closed} issues per batch before the cycles)"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
