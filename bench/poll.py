"""Forge requests per poll cycle with N open tasks (default 10,000), counted by the forge.

One batch of N tasks is taken in through the product (in-process sandbox forge), then real
`Service.poll_cycle()` calls are made (no service loop, no inbox): the first cycle is the
periodic full poll, then an idle cycle, a cycle after the lane closed 100 issues, and an
idle cycle right after that. The baseline is the seed's per-task polling: one GET per open
task per cycle (computed as the open-task count; a per-task loop over a sample times it).
Store I/O per cycle is counted by wrapping the TinyDB storage (no behaviour change).

`--whatif` then monkeypatches three proposed package changes into the same run (labelled
"what-if", not the product): stop paging at a full page without a `rel="next"` link, a
`since` without the 2-minute overlap (forge clock), and a count check instead of the
periodic full listing.

    python bench/poll.py [--tasks 10000] [--closed 100] [--sample 500] [--whatif] [--json]
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any
from unittest import mock

from _common import (
    BenchResult,
    Stopwatch,
    StoreIO,
    command_line,
    emit,
    make_tasks,
    parsed_file_cache,
    parser,
    settings_for,
)

from dropbox_eval import intake as intake_module
from dropbox_eval.forge import PAGE_LIMIT, GiteaClient
from dropbox_eval.intake import EvalIntake
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service, build_app
from dropbox_eval.store import Store

_NEXT = re.compile(r'<[^>]*>;\s*rel="next"')


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
        self.io = io
        self.pages = sum(1 for e in self.log if e.path.endswith("/issues"))
        self.comments = sum(1 for e in self.log if e.path.endswith("/comments"))

    def note(self) -> str:
        """Wall time and store I/O."""
        return f"{self.seconds * 1000:.0f} ms wall; store: {self.io.summary()}"


def finish(forge: SandboxForge, repo: str, numbers: list[int]) -> None:
    """Close issues as the lane would (comment + pass label)."""
    owner, name = repo.split("/", 1)
    for number in numbers:
        forge.finish_issue(owner, name, number, comment="Verdict: pass.", labels=["eval-pass"])


# -- what-if patches (proposed package changes, emulated) ------------------------------------

def _pages_until_no_next(self: GiteaClient, path: str,
                         params: dict[str, Any]) -> Iterator[list[Any]]:
    """Proposed `GiteaClient._pages`: a full page without rel="next" is the last page."""
    page = 1
    while True:
        response = self._retrying_send("GET", path, params={**params, "page": page,
                                                            "limit": PAGE_LIMIT})
        items = response.json()
        yield items
        link = response.headers.get("Link")
        if not items or (link is not None and not _NEXT.search(link)) or (
                link is None and len(items) < PAGE_LIMIT):
            return
        page += 1


def _count_check(poll: Any) -> Any:
    """Proposed full poll: list everything only when the forge's issue count disagrees.

    Wraps `EvalIntake.poll_batches(batch_ids, *, full)` (or the seed's `poll_completed`):
    one `limit=1` page gives X-Total-Count of the repo's task issues; when it equals the
    store's count of tasks with an issue, nothing was deleted and the cycle stays
    incremental.
    """

    def wrapper(self: EvalIntake, ids: Any, *args: Any, full: bool = False,
                **kwargs: Any) -> Any:
        if full:
            batch_ids = [ids] if isinstance(ids, str) else list(ids)
            repo = self.store.get_batch(batch_ids[0]).repo
            response = self.gitea._retrying_send(
                "GET", f"/repos/{repo}/issues",
                params={"state": "all", "type": "issues", "labels": self.settings.task_label,
                        "limit": 1})
            known = sum(1 for b in batch_ids for t in self.store.get_tasks(b)
                        if t.issue_number is not None and t.status != "missing")
            full = int(response.headers.get("X-Total-Count", -1)) != known
        return poll(self, ids, *args, full=full, **kwargs)

    return wrapper


def whatif_missing() -> str | None:
    """Why the what-if patches cannot be applied to this version of the package, if so."""
    needs = [(GiteaClient, "_pages"), (GiteaClient, "_retrying_send"),
             (intake_module, "SINCE_OVERLAP"), (Store, "get_batch"), (Store, "get_tasks")]
    missing = [f"{getattr(o, '__name__', o)}.{n}" for o, n in needs if not hasattr(o, n)]
    return ", ".join(missing) or None


@contextmanager
def proposed_changes() -> Iterator[None]:
    """All three what-if patches at once."""
    poll_name = "poll_batches" if hasattr(EvalIntake, "poll_batches") else "poll_completed"
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(GiteaClient, "_pages", _pages_until_no_next))
        stack.enter_context(mock.patch.object(intake_module, "SINCE_OVERLAP",
                                              timedelta(seconds=1)))
        stack.enter_context(mock.patch.object(EvalIntake, poll_name,
                                              _count_check(getattr(EvalIntake, poll_name))))
        yield


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--tasks", type=int, default=10_000)
    args_parser.add_argument("--closed", type=int, default=100)
    args_parser.add_argument("--sample", type=int, default=500,
                             help="issues polled one by one to time the per-task baseline")
    args_parser.add_argument("--whatif", action="store_true",
                             help="also measure the proposed changes (monkeypatched)")
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("poll", command_line())
    closed_target = 1 + math.ceil(args.closed / PAGE_LIMIT) + args.closed
    with SandboxForge(port=0) as forge, tempfile.TemporaryDirectory(prefix="bench-poll-") as home:
        settings = settings_for(home, forge.url, forge.token, forge.user, poll_interval=3600)
        every = settings.full_poll_every
        app = build_app(settings)
        app.billing.add_client("bench", 0)
        with Stopwatch() as intake_watch:
            submitted = app.intake.submit_batch("bench", make_tasks(args.tasks))
        batch_id = submitted["batch_id"]
        repo = app.store.get_batch(batch_id).repo
        numbers = sorted(int(i["issue_number"]) for i in submitted["issues"])
        service = Service(app)

        full = Cycle(service, forge)                     # cycle 1: the periodic full poll
        idle = Cycle(service, forge)                     # cycle 2: nothing changed
        finish(forge, repo, numbers[: args.closed])
        closed = Cycle(service, forge)                   # cycle 3: closures
        after = Cycle(service, forge)                    # cycle 4: idle, < 2 min later
        tasks = app.store.get_tasks(batch_id)
        finished = sum(1 for t in tasks if t.status == "passed")
        assert finished == args.closed, f"{finished} tasks finished, expected {args.closed}"
        open_count = sum(1 for t in tasks if t.status == "open")

        amortized = (full.requests + (every - 1) * idle.requests) / every
        result.add("idle cycle (nothing changed)", idle.requests, "requests", "<= 2",
                   idle.requests <= 2, note=idle.note())
        result.add(f"cycle with {args.closed} closed", closed.requests, "requests",
                   f"<= {closed_target}", closed.requests <= closed_target,
                   note=f"{closed.pages} list pages + {closed.comments} comment GETs; "
                        + closed.note())
        result.add("idle cycle right after closures", after.requests, "requests", "<= 2",
                   after.requests <= 2,
                   note=f"nothing changed, but the 2-minute `since` overlap re-lists the "
                        f"{args.closed} just-closed issues in {after.pages} pages; "
                        + after.note())
        result.add(f"full cycle (1 in {every}, finds deleted issues)", full.requests,
                   "requests", note=f"lists all {args.tasks} issues; " + full.note())
        result.add(f"mean per idle cycle over {every} cycles", amortized, "requests", "<= 2",
                   amortized <= 2, note=f"(1 full + {every - 1} idle) / {every}")

        result.add("store bytes read per idle cycle", idle.io.read_bytes / 1e6, "MB",
                   note=f"{idle.io.reads} whole-file reads, {idle.io.writes} writes "
                        f"({idle.io.write_bytes / 1e6:.1f} MB) for one {args.tasks}-task batch "
                        f"with nothing changed; {idle.seconds * 1000:.0f} ms wall")

        # The seed's per-task polling: one GET per open issue, timed on a sample.
        client = GiteaClient(forge.url, forge.token)
        sample = numbers[args.closed: args.closed + args.sample]
        forge.clear_requests()
        with Stopwatch() as per_task:
            for number in sample:
                client.get_issue(repo, number)
        sample_requests = len(forge.requests)
        per_cycle_s = per_task.seconds / max(1, len(sample)) * open_count
        result.add("seed per-task polling per cycle (baseline)", open_count, "requests",
                   note=f"one GET per open task (computed); a {len(sample)}-issue loop made "
                        f"{sample_requests} GETs in {per_task.seconds:.2f} s -> "
                        f"~{per_cycle_s:.1f} s per cycle")
        result.add("idle cycle / per-task polling", idle.requests / max(1, open_count), "",
                   note="requests ratio")

        missing = whatif_missing() if args.whatif else None
        if missing:
            result.info["what-if"] = f"skipped: the package no longer has {missing}"
        elif args.whatif:
            with proposed_changes():
                time.sleep(2.1)  # the earlier closures now lie before the next `since`
                Cycle(service, forge)  # settles `last_polled_at` under the patched overlap
                finish(forge, repo, numbers[args.closed: 2 * args.closed])
                time.sleep(2.1)  # closures lie in an earlier whole second than the cycle
                w_closed = Cycle(service, forge)
                w_after = Cycle(service, forge)
                service.cycles = every * (service.cycles // every + 1)  # next one is full
                w_full = Cycle(service, forge)
            result.add(f"what-if: cycle with {args.closed} closed", w_closed.requests,
                       "requests", f"<= {closed_target}", w_closed.requests <= closed_target,
                       note=f"{w_closed.pages} list pages; no trailing empty page")
            result.add("what-if: idle cycle right after closures", w_after.requests,
                       "requests", "<= 2", w_after.requests <= 2,
                       note="`since` = last poll start - 1 s (forge clock)")
            result.add("what-if: full cycle with count check", w_full.requests, "requests",
                       "<= 2", w_full.requests <= 2,
                       note="X-Total-Count of one limit=1 page equals the store's issue count")
            with parsed_file_cache():
                Cycle(service, forge)  # fills the cache
                w_store = Cycle(service, forge)
            result.add("what-if: idle cycle wall with a parsed-file cache",
                       w_store.seconds * 1000, "ms",
                       note=f"vs {idle.seconds * 1000:.0f} ms; store: {w_store.io.summary()}")
            w_amortized = (w_full.requests + (every - 1) * idle.requests) / every
            result.add(f"what-if: mean per idle cycle over {every} cycles", w_amortized,
                       "requests", "<= 2", w_amortized <= 2)

    result.info["setup"] = (f"{args.tasks}-task batch taken in in {intake_watch.seconds:.1f} s; "
                            "in-process SandboxForge; Service.poll_cycle() called directly")
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
