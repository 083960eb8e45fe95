"""Forge requests per poll cycle, counted by the forge.

First the farm (see `_farm.py`): 20 live batches x 500 tasks in the default mode, one repo
per batch, then the same with a shared repo: idle cycle, full reconciliation (nothing
changed; closures only the counts show; a deleted issue), 100 closures, and the idle
cycle's CPU against 1/100 of the tasks.

Then one repo: one batch of N tasks is taken in through the product (in-process sandbox
forge), then real `Service.poll_cycle()` calls are made (no service loop, no inbox): the
first cycle is the periodic full poll (a count, then the listing of closed issues), then an
idle cycle. Then the sandbox's `pulls` lane (status comment, PR `Closes #N`, verdict label,
merge or abandon) resolves 100 issues and a cycle sees them closed: they settle, nothing is
read yet. Then an idle cycle right after, and - once `--settle` seconds passed - the cycle
that reads each settled result once: one timeline GET per closure plus, with
`pull_details` (default), one GET per merged pull request. Then 100 more closures are seen
and, settled, read with `pull_details` off, and finally a full cycle after one open issue
was deleted (the full listing). The
baseline is the seed's per-task polling: one GET per open task per cycle (computed as the
open-task count; a per-task loop over a sample times it). Store I/O per cycle is counted by
wrapping the TinyDB storage (no behaviour change).

    python bench/poll.py [--batches 20] [--batch-tasks 500] [--tasks 10000] [--closed 100]
                         [--merge-ratio 1.0] [--settle 10] [--pause 2] [--sample 500] [--json]
"""

from __future__ import annotations

import math
import tempfile
import time

from _common import (
    BenchResult,
    Stopwatch,
    StoreIO,
    command_line,
    emit,
    make_tasks,
    parser,
    settings_for,
)
from _farm import farm_figures

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.forge.client import PAGE_LIMIT, GiteaClient
from dropbox_eval.sandbox import LaneConfig, SandboxForge
from dropbox_eval.service import Service


class Cycle:
    """Forge requests, wall time and store I/O of one `Service.poll_cycle()`."""

    def __init__(self, service: Service, forge: SandboxForge) -> None:
        forge.clear_requests()
        service.status.pop("last_error", None)
        with StoreIO() as io, Stopwatch() as watch:
            service.poll_cycle()
        if service.status.get("last_error"):
            raise RuntimeError(f"poll cycle failed: {service.status['last_error']}")
        self.log = forge.requests
        self.requests = len(self.log)
        self.seconds = watch.seconds
        self.ended = time.perf_counter()
        self.io = io
        self.pages = sum(1 for e in self.log if e.path.endswith("/issues"))
        self.timelines = sum(1 for e in self.log if e.path.endswith("/timeline"))
        self.pulls = sum(1 for e in self.log if "/pulls/" in e.path)
        self.counts = sum(1 for e in self.log if "limit=1&" in e.query + "&")
        self.gets = sum(1 for e in self.log if e.path.rsplit("/", 1)[-1].isdigit())

    def note(self) -> str:
        """Wall time and store I/O."""
        return f"{self.seconds * 1000:.0f} ms wall; store: {self.io.summary()}"

    def reads(self) -> str:
        """What the cycle asked for."""
        return (
            f"{self.pages} list pages + {self.timelines} timeline GETs + {self.pulls} pull GETs; "
        )


def resolve(forge: SandboxForge, repo: str, numbers: list[int]) -> None:
    """Let the held `pulls` lane work on these issues only: status comment, PR, verdict
    label and comment, then merge (the merge closes the issue) or abandon."""
    assert forge.lane is not None
    owner, name = repo.split("/", 1)
    for number in numbers:
        forge.lane.gate.release(owner, name, number)
    forge.lane.run_once(time.time() + 1)


def merged_prs(app: App, batch_id: str) -> int:
    """Finished tasks whose result has a merged pull request."""
    count = 0
    for task in app.store.get_tasks(batch_id):
        result = task.result
        count += bool(result and result.pull_request and result.pull_request.merged)
    return count


def after_settling(closed: Cycle, settle: float) -> None:
    """Sleep until the results seen by `closed` have settled (the forge's clock)."""
    time.sleep(max(0.0, settle - (time.perf_counter() - closed.ended)) + 1.5)


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--batches", type=int, default=20, help="farm: live batches")
    args_parser.add_argument("--batch-tasks", type=int, default=500, help="farm: tasks each")
    args_parser.add_argument("--tasks", type=int, default=10_000, help="one repo: tasks")
    args_parser.add_argument("--closed", type=int, default=100)
    args_parser.add_argument("--merge-ratio", type=float, default=1.0)
    args_parser.add_argument("--settle", type=float, default=10.0, help="settle_seconds")
    args_parser.add_argument(
        "--pause", type=float, default=2.0, help="seconds between intake and the first cycle"
    )
    args_parser.add_argument(
        "--sample",
        type=int,
        default=500,
        help="issues polled one by one to time the per-task baseline",
    )
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("poll", command_line())
    farm_figures(result, args.batches, args.batch_tasks)
    base_target = 1 + math.ceil(args.closed / PAGE_LIMIT) + args.closed
    lane = LaneConfig(mode="pulls", delay=0, interval=3600, merge_ratio=args.merge_ratio)
    with (
        SandboxForge(port=0, lane=lane, hold_lane=True) as forge,
        tempfile.TemporaryDirectory(prefix="bench-poll-") as home,
    ):
        settings = settings_for(
            home, forge.url, forge.token, forge.user, poll_interval=3600, settle_seconds=args.settle
        )
        every = settings.full_poll_every
        app = build_app(settings)
        app.billing.add_client("bench", 0)
        with Stopwatch() as intake_watch:
            submitted = app.intake.submit_batch("bench", make_tasks(args.tasks))
        batch_id = submitted["batch_id"]
        repo = app.store.get_batch(batch_id).repo
        numbers = sorted(int(i["issue_number"]) for i in submitted["issues"])
        service = service_for(app)
        # The 1 s `since` overlap lists issues created in the second before the previous
        # listing again, and while results settle the listing shows open issues too: in
        # service, intake and closures are minutes apart, so let the intake's second pass.
        time.sleep(args.pause)

        full = Cycle(service, forge)  # cycle 1: the periodic full poll
        idle = Cycle(service, forge)  # cycle 2: nothing changed
        resolve(forge, repo, numbers[: args.closed])
        closed = Cycle(service, forge)  # cycle 3: closures seen, settling, nothing read
        after = Cycle(service, forge)  # cycle 4: idle, right after
        after_settling(closed, args.settle)
        settled = Cycle(service, forge)  # cycle 5: settle time passed: each read once
        tasks = app.store.get_tasks(batch_id)
        finished = sum(1 for t in tasks if t.status.is_finished)
        assert finished == args.closed, f"{finished} tasks finished, expected {args.closed}"
        merged = merged_prs(app, batch_id)
        app.poller.reader.settings = settings.model_copy(update={"pull_details": False})
        resolve(forge, repo, numbers[args.closed : 2 * args.closed])
        seen = Cycle(service, forge)  # cycle 6: closures seen, settling
        after_settling(seen, args.settle)
        plain = Cycle(service, forge)  # cycle 7: read without pull details
        open_count = sum(1 for t in app.store.get_tasks(batch_id) if t.status == "open")

        pages_target = 1 + math.ceil(args.closed / PAGE_LIMIT)
        settled_target = base_target + merged
        result.add(
            "idle cycle (nothing changed)",
            idle.requests,
            "requests",
            "<= 2",
            idle.requests <= 2,
            note=idle.note(),
        )
        result.add(
            f"cycle seeing {args.closed} closures (they settle; nothing read yet)",
            closed.requests,
            "requests",
            f"<= {pages_target}",
            closed.requests <= pages_target and closed.timelines == 0,
            note=closed.reads() + closed.note(),
        )
        result.add(
            f"cycle reading the {args.closed} settled results ({merged} PRs merged), "
            "pull_details on",
            settled.requests,
            "requests",
            f"<= {settled_target}",
            settled.requests <= settled_target and settled.timelines == args.closed,
            note=settled.reads() + "each result read once, at settle time; " + settled.note(),
        )
        result.add(
            f"the same for {args.closed} more, pull_details off",
            plain.requests,
            "requests",
            f"<= {base_target}",
            plain.requests <= base_target and plain.pulls == 0,
            note=plain.reads() + plain.note(),
        )
        relisted = (
            "the 1 s `since` overlap (forge clock) lists the closures made in the "
            "second before the previous listing once more; settling tasks are not read "
            "before they settled"
            if after.pages > 1
            else "one list page"
        )
        result.add(
            "idle cycle right after closures",
            after.requests,
            "requests",
            "<= 2",
            after.requests <= 2 and after.timelines == 0,
            note=f"{after.pages} list pages, {after.timelines} timeline GETs: {relisted}; "
            + after.note(),
        )
        amortized = (full.requests + (every - 1) * idle.requests) / every
        result.add(
            f"full cycle (1 in {every}), nothing deleted",
            full.requests,
            "requests",
            note="X-Total-Count of a limit=1 page of open issues equals the store's "
            "open tasks, so the cycle stays incremental; " + full.note(),
        )
        result.add(
            f"mean per idle cycle over {every} cycles",
            amortized,
            "requests",
            "<= 2",
            amortized <= 2,
            note=f"(1 full + {every - 1} idle) / {every}",
        )

        result.add(
            "store bytes read per idle cycle",
            idle.io.read_bytes / 1e6,
            "MB",
            note=f"{idle.io.reads} whole-file reads, {idle.io.writes} writes "
            f"({idle.io.write_bytes / 1e6:.1f} MB) for one {args.tasks}-task batch "
            f"with nothing changed; {idle.seconds * 1000:.0f} ms wall",
        )

        # The seed's per-task polling: one GET per open issue, timed on a sample.
        client = GiteaClient(forge.url, forge.token)
        sample = numbers[2 * args.closed : 2 * args.closed + args.sample]
        forge.clear_requests()
        with Stopwatch() as per_task:
            for number in sample:
                client.get_issue(repo, number)
        sample_requests = len(forge.requests)
        per_cycle_s = per_task.seconds / max(1, len(sample)) * open_count
        result.add(
            "seed per-task polling per cycle (baseline)",
            open_count,
            "requests",
            note=f"one GET per open task (computed); a {len(sample)}-issue loop made "
            f"{sample_requests} GETs in {per_task.seconds:.2f} s -> "
            f"~{per_cycle_s:.1f} s per cycle",
        )
        result.add(
            "idle cycle / per-task polling",
            idle.requests / max(1, open_count),
            "",
            note="requests ratio",
        )

        # A deleted issue: the next full cycle's probe counts one open issue too few.
        owner, name = repo.split("/", 1)
        forge.delete_issue(owner, name, numbers[-1])
        service.forge.cycles = every * (service.cycles // every + 1)  # the next cycle is full
        deleted = Cycle(service, forge)
        missing = sum(1 for t in app.store.get_tasks(batch_id) if t.status == "missing")
        assert missing == 1, f"{missing} tasks missing after the deletion, expected 1"
        result.add(
            "full cycle after 1 issue was deleted",
            deleted.requests,
            "requests",
            note=f"{deleted.counts} count + {deleted.pages - deleted.counts} list pages "
            f"(the incremental one, then every issue) + {deleted.gets} GET of the unseen "
            "issue; " + deleted.note(),
        )

    result.info["setup"] = (
        f"{args.tasks}-task batch taken in in {intake_watch.seconds:.1f} s; "
        "in-process SandboxForge; Service.poll_cycle() called directly"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
