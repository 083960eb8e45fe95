"""Poll cost with many live repos: N batches of M tasks, counted from the sandbox's log.

For each mode - the default, one repo per batch (a cross-repo search finds what changed),
and a shared repo (`SAAS_EVAL_REPO`, one listing per cycle) - N batches are taken in
through the product, then real `Service.poll_cycle()` calls are counted (no service loop,
`full_poll_every` 3, settle 0): an idle cycle; a full reconciliation with nothing changed;
one after an issue was deleted in one repo; and a cycle after 100 issues spread over every
repo were closed by the lane (comment + label). Measured in steady state: the first cycle
waits until the intake is older than the search's 10 s overlap (issues created within it
are listed by the search again, one page per 50). The CPU time of an idle cycle is compared
with the same farm holding 1/100 of the tasks (same number of batches).

    python bench/farm.py [--batches 20] [--tasks 500] [--json]
"""

from __future__ import annotations

import math
import tempfile
import time

from _common import BenchResult, command_line, emit, make_tasks, parser, settings_for

from dropbox_eval.app import App, build_app
from dropbox_eval.forge import PAGE_LIMIT
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.scout import SEARCH_OVERLAP
from dropbox_eval.service import Service

CLOSURES = 100
SETTLED = SEARCH_OVERLAP.total_seconds() + 1


def build(forge: SandboxForge, home: str, batches: int, tasks: int, shared: bool) -> App:
    """A farm of `batches` running batches of `tasks` tasks each."""
    extra = {"full_poll_every": 3, "settle_seconds": 0, "poll_interval": 3600}
    if shared:
        extra["repo"] = f"{forge.user}/farm-{time.monotonic_ns()}"
    app = build_app(settings_for(home, forge.url, forge.token, forge.user, **extra))
    app.billing.add_client("farm", 0)
    for n in range(batches):
        app.intake.submit_batch("farm", make_tasks(tasks, f"b{n}-"), batch_ref=f"b{n}")
    return app


def counted(forge: SandboxForge, service: Service) -> tuple[int, float]:
    """(forge requests, CPU seconds) of one poll cycle."""
    forge.clear_requests()
    cpu = time.process_time()
    service.poll_cycle()
    return len(forge.requests), time.process_time() - cpu


def close_spread(app: App, forge: SandboxForge, count: int) -> None:
    """The lane closes `count` issues spread over every batch (comment + pass label)."""
    rows = app.store.list_batches(live_only=True)
    open_tasks = [
        [t for t in app.store.get_tasks(str(row["batch_id"])) if t.status == "open"] for row in rows
    ]
    for n in range(count):
        task = open_tasks[n % len(rows)][n // len(rows)]
        owner, repo = task.repo.split("/", 1)
        forge.finish_issue(owner, repo, task.issue_number or 0, comment="ok", labels=["eval-pass"])


def measure_mode(
    forge: SandboxForge, batches: int, tasks: int, shared: bool, result: BenchResult
) -> None:
    """Every figure of one mode."""
    mode = "shared repo" if shared else "one repo per batch"
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as home:
        app = build(forge, home, batches, tasks, shared)
        service = Service(app)
        service.poll_cycle()  # cycle 1, full: every repo listed once
        time.sleep(SETTLED)  # the intake is older than the search's overlap: steady state
        service.poll_cycle()  # cycle 2
        idle, idle_cpu = counted(forge, service)  # cycle 3
        full_idle, _ = counted(forge, service)  # cycle 4, full, nothing changed
        victim = app.store.get_tasks(str(app.store.list_batches(live_only=True)[0]["batch_id"]))[1]
        owner, repo = victim.repo.split("/", 1)
        forge.delete_issue(owner, repo, victim.issue_number or 0)
        service.poll_cycle()  # cycle 5
        service.poll_cycle()  # cycle 6
        full_deleted, _ = counted(forge, service)  # cycle 7, full
        close_spread(app, forge, CLOSURES)
        closures, _ = counted(forge, service)  # cycle 8
        pages = math.ceil(CLOSURES / PAGE_LIMIT)
        repos = 1 if shared else batches
        result.add(f"{mode}: idle cycle", idle, "requests", "<= 2", idle <= 2)
        result.add(
            f"{mode}: full reconciliation, nothing changed",
            full_idle,
            "requests",
            f"<= {1 + 1}",
            full_idle <= 2,
            note=f"{repos} repo(s)",
        )
        result.add(
            f"{mode}: full reconciliation, 1 issue deleted",
            full_deleted,
            "requests",
            note="the repo that lost an issue is listed in full, plus one GET",
        )
        target = 1 + pages + CLOSURES
        result.add(
            f"{mode}: cycle with {CLOSURES} closures",
            closures,
            "requests",
            f"<= {target}",
            closures <= target,
        )
        result.info[f"{mode} idle cycle CPU"] = f"{idle_cpu * 1000:.1f} ms"
        missing = [t for t in app.store.get_tasks(victim.batch_id) if t.task_id == victim.task_id]
        assert missing[0].status == "missing", "the deleted issue was not found"


def idle_cpu(forge: SandboxForge, batches: int, tasks: int) -> float:
    """CPU seconds of an idle cycle (median of 5) in the default mode."""
    with tempfile.TemporaryDirectory(prefix="bench-farm-cpu-") as home:
        service = Service(build(forge, home, batches, tasks, False))
        service.poll_cycle()
        time.sleep(SETTLED)
        service.poll_cycle()
        samples = sorted(counted(forge, service)[1] for _ in range(5))
        return samples[2]


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--batches", type=int, default=20)
    args_parser.add_argument("--tasks", type=int, default=500)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("farm", command_line())
    with SandboxForge(port=0) as forge:
        measure_mode(forge, args.batches, args.tasks, False, result)
        measure_mode(forge, args.batches, args.tasks, True, result)
        small = idle_cpu(forge, args.batches, max(1, args.tasks // 100))
        large = idle_cpu(forge, args.batches, args.tasks)
    result.add(
        f"idle cycle CPU, {args.tasks} vs {max(1, args.tasks // 100)} tasks per batch",
        large / small,
        "x",
        "<= 1.2",
        large / small <= 1.2,
        note=f"{large * 1000:.1f} ms vs {small * 1000:.1f} ms (one repo per batch)",
    )
    result.info["setup"] = (
        f"{args.batches} batches x {args.tasks} tasks, in-process SandboxForge, requests "
        "counted from its log; settle 0; full_poll_every 3"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
