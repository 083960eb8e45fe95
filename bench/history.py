"""Does a batch cost more when the state folder already holds a long history?

200 batches of 20 tasks go through the product one after another in the same state
folder (in-process sandbox forge, one repo per batch, task_price 1 so the ledger grows
too). For each batch: `submit_batch` (timed), the lane closes all its issues (not timed),
`poll_completed` (timed; fetches 20 results and completes the batch), `emit` (timed
separately; the report goes to the outbox, the batch becomes history). The figure is
median(intake + poll) of the last W batches over the first W (W = 5), after one warm-up
batch in another folder.

Then the listings (see `_listing.py`): `batches`, `clients show` and the API listing with
5 and with 2,000 archived batches, each a ratio against the small history.

    python bench/history.py [--batches 200] [--tasks 20] [--window 5]
                            [--listing-small 5] [--listing-large 2000] [--json]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

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
from _listing import listing_figures

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.sandbox import SandboxForge

TARGET_RATIO = 1.2


class Timing:
    """Seconds of each step of one batch, and the store I/O of intake + poll."""

    def __init__(self, intake: float, poll: float, emit: float, io: StoreIO) -> None:
        self.intake, self.poll, self.emit, self.io = intake, poll, emit, io

    @property
    def total(self) -> float:
        """Intake + poll."""
        return self.intake + self.poll


def one_batch(app: App, forge: SandboxForge, index: int, tasks: int) -> Timing:
    """Take one batch in, let the lane finish it, poll it to completion, emit it."""
    with StoreIO() as io:
        with Stopwatch() as intake:
            result = app.intake.submit_batch(
                "bench", make_tasks(tasks, f"b{index}-"), batch_ref=f"run-{index}"
            )
        assert result["ok"], result
        batch_id = result["batch_id"]
        owner, name = app.store.get_batch(batch_id).repo.split("/", 1)
        for issue in result["issues"]:
            forge.finish_issue(
                owner,
                name,
                int(issue["issue_number"]),
                comment='Verdict: pass.\n\n```json\n{"score": 1}\n```',
                labels=["eval-pass"],
            )
        with Stopwatch() as poll:
            finished = app.poller.poll_completed(batch_id)
    assert len(finished) == tasks, f"batch {index}: {len(finished)} of {tasks} finished"
    with Stopwatch() as emitted:
        app.delivery.emit(batch_id)
    return Timing(intake.seconds, poll.seconds, emitted.seconds, io)


def run_series(
    forge: SandboxForge, home: Path, batches: int, tasks: int
) -> tuple[list[Timing], float, float, int, int]:
    """(timings, idle cycle after batch 1, idle cycle at the end, index.json bytes,
    archive bytes)."""
    app = build_app(settings_for(str(home), forge.url, forge.token, forge.user, task_price=1))
    app.billing.add_client("bench", batches * tasks)
    timings: list[Timing] = []
    idle_first = 0.0
    for index in range(1, batches + 1):
        timings.append(one_batch(app, forge, index, tasks))
        if index == 1:
            idle_first = service_idle_cycle(app)
    idle_last = service_idle_cycle(app)
    state = app.settings.state_path
    archive = sum(p.stat().st_size for p in (state / "archive").glob("*.jsonl"))
    return timings, idle_first, idle_last, (state / "index.json").stat().st_size, archive


def service_idle_cycle(app: App) -> float:
    """Seconds of one service poll cycle when every batch is emitted (history only)."""
    service = service_for(app)
    service.forge.cycles = 1  # not the periodic full poll
    with Stopwatch() as watch:
        service.poll_cycle()
    return watch.seconds


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--batches", type=int, default=200)
    args_parser.add_argument("--tasks", type=int, default=20)
    args_parser.add_argument("--window", type=int, default=5)
    args_parser.add_argument("--listing-small", type=int, default=5)
    args_parser.add_argument("--listing-large", type=int, default=2000)
    args = args_parser.parse_args()
    started = time.perf_counter()
    window = max(1, min(args.window, args.batches // 2))
    with SandboxForge(port=0) as forge, tempfile.TemporaryDirectory(prefix="bench-hist-") as tmp:
        warm = build_app(settings_for(str(Path(tmp) / "warm"), forge.url, forge.token, forge.user))
        warm.billing.add_client("bench", 0)
        one_batch(warm, forge, 0, args.tasks)
        timings, idle_first, idle_last, index_bytes, archive_bytes = run_series(
            forge, Path(tmp) / "main", args.batches, args.tasks
        )

    first, last = timings[:window], timings[-window:]

    def med(items: list[Timing], attr: str) -> float:
        return statistics.median(getattr(t, attr) for t in items)

    ratio = med(last, "total") / med(first, "total")
    result = BenchResult("history", command_line())
    span = f"batches 1-{window} vs {args.batches - window + 1}-{args.batches}"
    result.add(
        f"intake+poll, batch #1 window (median of {window})",
        med(first, "total") * 1000,
        "ms",
        note=f"intake {med(first, 'intake') * 1000:.1f} ms + poll "
        f"{med(first, 'poll') * 1000:.1f} ms; store "
        f"{first[0].io.summary()}",
    )
    result.add(
        f"intake+poll, batch #{args.batches} window (median of {window})",
        med(last, "total") * 1000,
        "ms",
        note=f"intake {med(last, 'intake') * 1000:.1f} ms + poll "
        f"{med(last, 'poll') * 1000:.1f} ms; store {last[-1].io.summary()}",
    )
    result.add(
        f"ratio #{args.batches} / #1",
        ratio,
        "",
        f"<= {TARGET_RATIO}",
        ratio <= TARGET_RATIO,
        note=span,
    )
    slope, intercept = statistics.linear_regression(
        list(range(1, len(timings) + 1)), [t.total * 1000 for t in timings]
    )
    at_2000 = (intercept + slope * 2000) / max(intercept + slope, 1e-9)
    trend = (
        f"extrapolated ratio at batch #2000: {at_2000:.2f}"
        if slope > 0
        else "no growth (a negative slope is warm-up and noise)"
    )
    result.add(
        "growth per 100 batches of history",
        slope * 100,
        "ms",
        note=f"least-squares slope over all {len(timings)} batches; {trend}",
    )
    emit_ratio = med(last, "emit") / med(first, "emit")
    result.add(
        "emit ratio (context)",
        emit_ratio,
        "",
        note=f"{med(first, 'emit') * 1000:.1f} ms -> {med(last, 'emit') * 1000:.1f} ms",
    )
    result.add(
        "service idle cycle ratio (context)",
        idle_last / max(idle_first, 1e-9),
        "",
        note=f"all batches emitted: {idle_first * 1000:.1f} ms with 1 batch of history"
        f" -> {idle_last * 1000:.1f} ms with {args.batches}",
    )
    result.info["setup"] = (
        f"{args.batches} batches x {args.tasks} tasks, one repo per batch, "
        f"in-process SandboxForge; at the end index.json "
        f"{index_bytes / 1000:.1f} kB, archive/*.jsonl "
        f"{archive_bytes / 1000:.0f} kB"
    )
    listing_figures(result, args.listing_small, args.listing_large)
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
