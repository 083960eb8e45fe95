"""Scrape cost against history: `GET /metrics` and the operator's pages (the overview, the
list of ended batches, unfiltered and filtered by client and status, and a batch's page)
with 5 and with 2,000 archived batches, in one run.

Each history is made through the store's own paths, for one client: a batch created with
its hold, settled (charge and release), emitted and so archived (its running totals added),
then one batch left running. The figures are the median of 60 scrapes of the real web app
over loopback HTTP (`create_web`, as `run --http-port` and `serve` mount it), and of 60
views of each operator page with a signed-in session (the list's page holds PAGE rows, so
both histories fill it).

    python bench/metrics.py [--small 5] [--large 2000] [--json]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests
from _common import (
    BenchResult,
    Stopwatch,
    add_history_ratios,
    command_line,
    emit,
    make_tasks,
    paired_median_ms,
    parser,
)

from dropbox_eval.app import App, build_app
from dropbox_eval.config import load_settings
from dropbox_eval.models import (
    BatchRecord,
    BatchStatus,
    LedgerEntry,
    TaskRecord,
    TaskSpec,
    TaskStatus,
    utcnow,
)
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web

CALLS = 60  # per read and history, alternating (the pages' few ms swing with the load)
PAGE = 5  # the ended list's page: the same rows in both histories (5 archived fill it)
KEY = "bench-operator-key"


def add_batch(app: App, n: int, *, archive: bool) -> None:
    """One batch of one task through the store: created with its hold; when `archive`,
    the task passes, the batch is settled, emitted and archived."""
    now = utcnow()
    batch_id = f"20260101-000000-{n:09d}"
    batch = BatchRecord(batch_id=batch_id, client_id="acme", repo="eval/x", total=1, created_at=now)
    task = TaskRecord(
        task_id="t0",
        batch_id=batch_id,
        repo="eval/x",
        payload=TaskSpec.model_validate(make_tasks(1)[0]),
        created_at=now,
    )
    entry = {"client_id": "acme", "batch_id": batch_id, "balance_after": 0, "at": now}
    hold = LedgerEntry(amount=0, held_change=1, kind="hold", **entry)
    with app.store.transaction() as tx:
        tx.record_batch(batch, [task], hold)
    if not archive:
        return
    app.store.update_tasks(batch_id, {"t0": {"status": TaskStatus.PASSED, "finished_at": now}})
    app.store.settle(
        [
            LedgerEntry(amount=-1, kind="charge", **entry),
            LedgerEntry(amount=0, held_change=-1, kind="release", **entry),
        ]
    )
    app.store.update_batch(batch_id, status=BatchStatus.EMITTED, done=1, completed_at=now)
    app.store.update_batch(batch_id, emitted_at=now)  # archives it


def history(home: Path, batches: int) -> tuple[Callable[[], object], ...]:
    """A served state folder with `batches` archived batches and one running; the reads."""
    app = build_app(load_settings(home=home, operator_key=KEY), with_forge=False)
    app.billing.add_client("acme", 10**9)
    for n in range(batches):
        add_batch(app, n, archive=True)
    add_batch(app, batches, archive=False)
    counts = {"emitted": batches, "running": 1}
    assert app.store.count_batches() == {k: n for k, n in counts.items() if n}
    server = BackgroundServer(create_web(app.web, lambda: {}), name="bench-web")
    url = server.start()
    session = requests.Session()
    session.post(f"{url}/operator/login", data={"key": KEY}, timeout=30).raise_for_status()

    def scrape() -> None:
        text = requests.get(f"{url}/metrics", timeout=30).text
        assert f'dropbox_eval_batches{{status="emitted"}} {batches}.0' in text

    def view(path: str, **params: object) -> Callable[[], None]:
        return lambda: session.get(f"{url}{path}", params=params, timeout=30).raise_for_status()

    running = f"20260101-000000-{batches:09d}"
    return (
        scrape,
        view("/operator"),
        view("/operator/batches", limit=PAGE),
        view("/operator/batches", client="acme", status="emitted", limit=PAGE),
        view(f"/operator/batches/{running}"),
        view("/operator/batches", status="failed", limit=PAGE),  # none match
        server.stop,
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--small", type=int, default=5)
    args_parser.add_argument("--large", type=int, default=2000)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("metrics", command_line())
    names = (
        "GET /metrics",
        "GET /operator (signed in)",
        f"GET /operator/batches (ended, first page of {PAGE})",
        f"GET /operator/batches?client=acme&status=emitted (first page of {PAGE})",
        "GET /operator/batches/{id} (a running batch's page)",
    )
    with tempfile.TemporaryDirectory() as small_home, tempfile.TemporaryDirectory() as big_home:
        small = history(Path(small_home), args.small)
        with Stopwatch() as setup:
            large = history(Path(big_home), args.large)
        try:
            reads = dict(zip(names, zip(small[:-2], large[:-2], strict=True), strict=True))
            add_history_ratios(result, reads, args.small, args.large, calls=CALLS)
            few, many = paired_median_ms(small[-2], large[-2], CALLS)
            result.add(
                f"GET /operator/batches?status=failed, none of them (context): "
                f"{args.large} / {args.small} archived",
                many / few,
                "x",
                note=f"{many:.2f} ms vs {few:.2f} ms: no row matches; the index's count "
                "says so, and the archive is not read",
            )
        finally:
            small[-1]()
            large[-1]()
    result.info["setup"] = (
        f"one client with {args.small} and {args.large} archived batches (1 task, hold, "
        f"charge, release each) plus one running, made through the store "
        f"({setup.seconds:.0f} s for {args.large}); median of {CALLS} calls over loopback HTTP"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
