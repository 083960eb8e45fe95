"""Poll cost with many live repos: N batches of M tasks, counted from the sandbox's log.

Used by `bench/poll.py`. For each mode - the default, one repo per batch (a cross-repo
search finds what changed), and a shared repo (`SAAS_EVAL_REPO`, one listing per cycle) - N
batches are taken in through the product, then real `Service.poll_cycle()` calls are
counted (no service loop, `full_poll_every` 3, settle 0):
- an idle cycle;
- a full reconciliation with nothing changed;
- one after the lane closed an issue in each of 3 repos (1 in the shared repo) while the
  search's indexer lagged by an hour, so only the counts can tell;
- one after an issue was deleted in one repo;
- a cycle after 100 issues spread over every repo were closed (comment + label).
Measured in steady state: the first cycle waits until the intake is older than the search's
10 s overlap (issues created within it are listed by the search again, one page per 50).
The CPU time of an idle cycle is compared with the same farm holding 1/100 of the tasks.
"""

from __future__ import annotations

import math
import resource
import tempfile
import time
from typing import Any

from _common import BenchResult, make_tasks, settings_for
from _forge import ForgeProcess

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.forge.client import PAGE_LIMIT
from dropbox_eval.models import TaskRecord
from dropbox_eval.results.scout import SEARCH_OVERLAP
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service

CLOSURES = 100
EVERY = 3
SETTLED = SEARCH_OVERLAP.total_seconds() + 1


def build(forge: Any, home: str, batches: int, tasks: int, shared: bool, every: int = EVERY) -> App:
    """A farm of `batches` running batches of `tasks` tasks each."""
    extra = {"full_poll_every": every, "settle_seconds": 0, "poll_interval": 3600}
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


def to_next_full(service: Service, every: int) -> None:
    """Idle cycles until the next one is the periodic full reconciliation."""
    while service.cycles % every != 0:
        service.poll_cycle()


def open_tasks(app: App) -> list[list[TaskRecord]]:
    """Each live batch's open tasks."""
    rows = app.store.list_batches(live_only=True)
    return [
        [t for t in app.store.get_tasks(str(row["batch_id"])) if t.status == "open"] for row in rows
    ]


def close_spread(forge: SandboxForge, batches: list[list[TaskRecord]], count: int) -> None:
    """The lane closes `count` issues spread over these batches (comment + pass label)."""
    for n in range(count):
        task = batches[n % len(batches)][n // len(batches)]
        owner, repo = task.repo.split("/", 1)
        forge.finish_issue(owner, repo, task.issue_number or 0, comment="ok", labels=["eval-pass"])


def measure_mode(
    forge: SandboxForge, batches: int, tasks: int, shared: bool, result: BenchResult
) -> None:
    """Every figure of one mode."""
    mode = "shared repo" if shared else "one repo per batch"
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as home:
        app = build(forge, home, batches, tasks, shared)
        service = service_for(app)
        service.poll_cycle()  # cycle 1, full: every repo listed once
        time.sleep(SETTLED)  # the intake is older than the search's overlap: steady state
        service.poll_cycle()  # cycle 2
        idle, idle_cpu = counted(forge, service)  # cycle 3
        first_full, _ = counted(forge, service)  # cycle 4, full: looks the owner's id up once
        to_next_full(service, EVERY)
        full_idle, _ = counted(forge, service)  # cycle 7, full, nothing changed
        changed = 1 if shared else 3
        to_next_full(service, EVERY)
        forge.state.indexer_lag = 3600.0  # the search shows none of these closures
        close_spread(forge, open_tasks(app)[:changed], changed)
        forge.state.indexer_lag = 0.0
        forge.clear_requests()
        service.poll_cycle()  # full: counts, then the repos whose counts changed
        timelines = sum(1 for r in forge.requests if r.path.endswith("/timeline"))
        full_changed = len(forge.requests) - timelines
        victim = open_tasks(app)[0][1]
        owner, repo = victim.repo.split("/", 1)
        forge.delete_issue(owner, repo, victim.issue_number or 0)
        to_next_full(service, EVERY)
        full_deleted, _ = counted(forge, service)
        time.sleep(SETTLED)  # steady state again: earlier changes are out of every overlap
        service.poll_cycle()
        close_spread(forge, open_tasks(app), CLOSURES)
        closures, _ = counted(forge, service)  # not a full cycle
        pages = math.ceil(CLOSURES / PAGE_LIMIT)
        repos = 1 if shared else batches
        result.add(f"{mode}: idle cycle", idle, "requests", "<= 2", idle <= 2)
        result.add(
            f"{mode}: full reconciliation, nothing changed",
            full_idle,
            "requests",
            "<= 1",
            full_idle <= 1,
            note=f"{repos} repo(s); the first one after a start: {first_full}"
            + ("" if shared else " (GET /users/<owner> for the owner's id, once per process)"),
        )
        result.add(
            f"{mode}: full reconciliation, closures in {changed} repo(s) the search missed",
            full_changed,
            "requests",
            f"<= {1 + changed}",
            full_changed <= 1 + changed and timelines == changed,
            note=f"plus {timelines} timeline GETs, one per closed issue as in every cycle",
        )
        result.add(
            f"{mode}: full reconciliation, 1 issue deleted",
            full_deleted,
            "requests",
            note="count, an incremental listing, then that repo listed in full, one GET",
        )
        target = 1 + pages + CLOSURES
        result.add(
            f"{mode}: cycle with {CLOSURES} closures",
            closures,
            "requests",
            f"<= {target}",
            closures <= target,
        )
        result.info[f"{mode} idle cycle CPU"] = f"{idle_cpu * 1000:.1f} ms (with the forge's)"
        missing = [t for t in app.store.get_tasks(victim.batch_id) if t.task_id == victim.task_id]
        assert missing[0].status == "missing", "the deleted issue was not found"


def idle_service(forge: Any, home: str, batches: int, tasks: int, shared: bool) -> Service:
    """A farm in steady state: polled once, then past the search's overlap, then again."""
    service = service_for(build(forge, home, batches, tasks, shared, every=1000))
    service.poll_cycle()
    time.sleep(SETTLED)
    service.poll_cycle()
    return service


def cycle_cpu(service: Service, cycles: int = 25) -> tuple[float, float]:
    """(user, system) CPU seconds of this process per idle cycle, over `cycles`."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(cycles):
        service.poll_cycle()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) / cycles, (after.ru_stime - before.ru_stime) / cycles


def idle_cpu(
    forge: Any, batches: int, tasks: int, shared: bool
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(user, system) CPU per idle cycle of this process (the product alone: the forge runs
    in its own) with 1/100 of the tasks and with all of them, the two farms measured in
    turn, 4 rounds of 25 cycles each. System time is mostly the kernel's share of the
    cycle's fsyncs (a shared repo's idle cycle writes each batch's `last_polled_at`), the
    same at any size, but as noisy as the disk."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-farm-cpu-") as small_home,
        tempfile.TemporaryDirectory(prefix="bench-farm-cpu-") as large_home,
    ):
        services = (
            idle_service(forge, small_home, batches, max(1, tasks // 100), shared),
            idle_service(forge, large_home, batches, tasks, shared),
        )
        for service in services:  # the first farm's search window catches up with the
            service.poll_cycle()  # second farm's intake (both search the same owner)
        totals = [[0.0, 0.0], [0.0, 0.0]]
        for _ in range(4):
            for index, service in enumerate(services):
                user, system = cycle_cpu(service)
                totals[index][0] += user / 4
                totals[index][1] += system / 4
        return (totals[0][0], totals[0][1]), (totals[1][0], totals[1][1])


def farm_figures(result: BenchResult, batches: int, tasks: int) -> None:
    """Both modes' request counts, and the idle cycle's CPU against 1/100 of the tasks."""
    with SandboxForge(port=0) as forge:
        measure_mode(forge, batches, tasks, False, result)
        measure_mode(forge, batches, tasks, True, result)
    with ForgeProcess() as remote:  # the forge's own CPU (it filters every issue) apart
        for shared in (False, True):
            (small, small_sys), (large, large_sys) = idle_cpu(remote, batches, tasks, shared)
            mode = "shared repo" if shared else "one repo per batch"
            result.add(
                f"{mode}: idle cycle user CPU, {tasks} vs {max(1, tasks // 100)} tasks per batch",
                large / small,
                "x",
                "<= 1.2",
                large / small <= 1.2,
                note=f"{large * 1000:.1f} ms vs {small * 1000:.1f} ms; system time "
                f"{large_sys * 1000:.1f} vs {small_sys * 1000:.1f} ms",
            )
    result.info["farm setup"] = (
        f"{batches} batches x {tasks} tasks, in-process SandboxForge, requests counted from "
        f"its log; settle 0; full_poll_every {EVERY}"
    )
