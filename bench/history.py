"""Does a batch cost more when the state folder already holds a long history?

200 batches of 20 tasks go through the product one after another in the same state
folder (in-process sandbox forge, one repo per batch, task_price 1 so the ledger grows
too). For each batch: `submit_batch` (timed), the lane closes all its issues (not timed),
`poll_completed` (timed; fetches 20 results and completes the batch), `emit` (timed
separately; the report goes to the outbox, the batch becomes history). The figure is
median(intake + poll) of the last W batches over the first W (W = 5), after one warm-up
batch in another folder. `--whatif` repeats the series in a new folder with a read cache of
the parsed index monkeypatched into the store (a proposed change, not the product).

    python bench/history.py [--batches 200] [--tasks 20] [--window 5] [--whatif] [--json]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

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

from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import App, Service, build_app
from dropbox_eval.store import Store

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
            result = app.intake.submit_batch("bench", make_tasks(tasks, f"b{index}-"),
                                             batch_ref=f"run-{index}")
        assert result["ok"], result
        batch_id = result["batch_id"]
        owner, name = app.store.get_batch(batch_id).repo.split("/", 1)
        for issue in result["issues"]:
            forge.finish_issue(owner, name, int(issue["issue_number"]),
                               comment="Verdict: pass.\n\n```json\n{\"score\": 1}\n```",
                               labels=["eval-pass"])
        with Stopwatch() as poll:
            finished = app.intake.poll_completed(batch_id)
    assert len(finished) == tasks, f"batch {index}: {len(finished)} of {tasks} finished"
    with Stopwatch() as emitted:
        app.intake.emit(batch_id)
    return Timing(intake.seconds, poll.seconds, emitted.seconds, io)


@contextmanager
def index_read_cache() -> Iterator[None]:
    """Proposed store change: reuse the parsed index while index.json is unchanged.

    Emulated for the read-only `Store.get_client` and `Store.list_batches` (the index is
    replaced atomically on every write, so (inode, mtime_ns, size) is a sound key).
    """
    cache: dict[str, tuple[tuple[int, int, int], Any]] = {}

    def identity(store: Store) -> tuple[int, int, int] | None:
        try:
            info = os.stat(Path(store.state_dir) / "index.json")
        except (AttributeError, OSError):
            return None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def load(store: Store, kind: str, compute: Any) -> Any:
        key = identity(store)
        hit = cache.get(kind)
        if key is not None and hit is not None and hit[0] == key:
            return hit[1]
        value = compute()
        if key is not None:
            cache[kind] = (key, value)
        return value

    get_client, list_batches = Store.get_client, Store.list_batches

    def cached_client(self: Store, client_id: str) -> Any:
        clients = load(self, "clients", lambda: {c.client_id: c for c in self.list_clients()})
        return clients.get(client_id) if clients else get_client(self, client_id)

    def cached_batches(self: Store, where: Any = None) -> Any:
        rows = load(self, "batches", lambda: list_batches(self))
        return [dict(r) for r in rows if where is None or where(r)]

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(Store, "get_client", cached_client))
        stack.enter_context(mock.patch.object(Store, "list_batches", cached_batches))
        yield


def run_series(forge: SandboxForge, home: Path, batches: int, tasks: int) -> tuple[
        list[Timing], float, float, int]:
    """(timings, idle cycle after batch 1, idle cycle at the end, index.json bytes)."""
    app = build_app(settings_for(str(home), forge.url, forge.token, forge.user, task_price=1))
    app.billing.add_client("bench", batches * tasks)
    timings: list[Timing] = []
    idle_first = 0.0
    for index in range(1, batches + 1):
        timings.append(one_batch(app, forge, index, tasks))
        if index == 1:
            idle_first = service_idle_cycle(app)
    idle_last = service_idle_cycle(app)
    return timings, idle_first, idle_last, (app.settings.state_path / "index.json").stat().st_size


def service_idle_cycle(app: App) -> float:
    """Seconds of one service poll cycle when every batch is emitted (history only)."""
    service = Service(app)
    service.cycles = 1  # not the periodic full poll
    with Stopwatch() as watch:
        service.poll_cycle()
    return watch.seconds


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--batches", type=int, default=200)
    args_parser.add_argument("--tasks", type=int, default=20)
    args_parser.add_argument("--window", type=int, default=5)
    args_parser.add_argument("--whatif", action="store_true",
                             help="repeat the series with an index read cache monkeypatched in")
    args = args_parser.parse_args()
    started = time.perf_counter()
    window = max(1, min(args.window, args.batches // 2))
    with SandboxForge(port=0) as forge, tempfile.TemporaryDirectory(prefix="bench-hist-") as tmp:
        warm = build_app(settings_for(str(Path(tmp) / "warm"), forge.url, forge.token,
                                      forge.user))
        warm.billing.add_client("bench", 0)
        one_batch(warm, forge, 0, args.tasks)
        timings, idle_first, idle_last, index_bytes = run_series(
            forge, Path(tmp) / "main", args.batches, args.tasks)
        cached: list[Timing] = []
        if args.whatif:
            with index_read_cache():
                cached = run_series(forge, Path(tmp) / "whatif", args.batches, args.tasks)[0]

    first, last = timings[:window], timings[-window:]

    def med(items: list[Timing], attr: str) -> float:
        return statistics.median(getattr(t, attr) for t in items)

    ratio = med(last, "total") / med(first, "total")
    result = BenchResult("history", command_line())
    span = f"batches 1-{window} vs {args.batches - window + 1}-{args.batches}"
    result.add(f"intake+poll, batch #1 window (median of {window})", med(first, "total") * 1000,
               "ms", note=f"intake {med(first, 'intake') * 1000:.1f} ms + poll "
                          f"{med(first, 'poll') * 1000:.1f} ms; store "
                          f"{first[0].io.summary()}")
    result.add(f"intake+poll, batch #{args.batches} window (median of {window})",
               med(last, "total") * 1000, "ms",
               note=f"intake {med(last, 'intake') * 1000:.1f} ms + poll "
                    f"{med(last, 'poll') * 1000:.1f} ms; store {last[-1].io.summary()}")
    result.add(f"ratio #{args.batches} / #1", ratio, "", f"<= {TARGET_RATIO}",
               ratio <= TARGET_RATIO, note=span)
    slope, intercept = statistics.linear_regression(
        list(range(1, len(timings) + 1)), [t.total * 1000 for t in timings])
    at_2000 = (intercept + slope * 2000) / max(intercept + slope, 1e-9)
    result.add("growth per 100 batches of history", slope * 100, "ms",
               note=f"least-squares slope over all {len(timings)} batches; extrapolated "
                    f"ratio at batch #2000: {at_2000:.2f}")
    emit_ratio = med(last, "emit") / med(first, "emit")
    result.add("emit ratio (context)", emit_ratio, "",
               note=f"{med(first, 'emit') * 1000:.1f} ms -> {med(last, 'emit') * 1000:.1f} ms")
    result.add("service idle cycle ratio (context)", idle_last / max(idle_first, 1e-9), "",
               note=f"all batches emitted: {idle_first * 1000:.1f} ms with 1 batch of history"
                    f" -> {idle_last * 1000:.1f} ms with {args.batches}")
    if cached:
        w_ratio = med(cached[-window:], "total") / med(cached[:window], "total")
        result.add(f"what-if: ratio #{args.batches} / #1 with an index read cache", w_ratio, "",
                   f"<= {TARGET_RATIO}", w_ratio <= TARGET_RATIO,
                   note=f"{med(cached[:window], 'total') * 1000:.1f} ms -> "
                        f"{med(cached[-window:], 'total') * 1000:.1f} ms; get_client and "
                        f"list_batches reuse the parsed index; store "
                        f"{cached[-1].io.summary()}")
    result.info["setup"] = (f"{args.batches} batches x {args.tasks} tasks, one repo per batch, "
                            f"in-process SandboxForge; index.json at the end: "
                            f"{index_bytes / 1000:.0f} kB")
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
