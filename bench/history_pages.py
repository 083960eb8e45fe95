"""History pages when every batch overlaps every other in time, and what an archived batch
keeps on disk.

Each history is made through the store's own paths (a batch recorded with its hold, its
task passed, settled, emitted and so archived), for one client, with every batch created
before the first one ended: created `n` seconds after a start an hour ago, archived now.
A page ordered by creation time cannot stop reading at any row of such an archive. The
figures: the median time of the operator's list of ended batches (`/operator/batches`,
PAGE rows, and its next page), the API's first page with `X-Total-Count`, and the store's
`page_batches`, with `--small` and with `--large` archived batches, each a ratio against
the small history, paired calls alternating. Then, from the large history: the files and
bytes the state folder holds per archived batch (the outbox report counted apart).

The histories are written on `--dir` (default /dev/shm when there is one: building 20,000
batches costs their fsyncs, not what is measured; the pages are read from the page cache
in both cases).

    python bench/history_pages.py [--small 10] [--large 2000] [--calls 20] [--dir D] [--json]
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import requests
from _common import BenchResult, add_history_ratios, command_line, emit, make_tasks, parser

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

PAGE = 5  # the small history (default 10) fills the first two pages
KEY = "bench-operator-key"


def add_overlapping(app: App, n: int, tasks: int) -> None:
    """One batch created an hour ago plus `n` seconds (before any other ended), passed,
    settled, emitted now and so archived."""
    now = utcnow()
    created = now - timedelta(hours=1) + timedelta(seconds=n % 3000, microseconds=n)
    batch_id = f"{created:%Y%m%d-%H%M%S}-{n:09d}"
    batch = BatchRecord(
        batch_id=batch_id, client_id="acme", repo="eval/x", total=tasks, created_at=created
    )
    specs = make_tasks(tasks)
    records = [
        TaskRecord(
            task_id=f"t{i}",
            batch_id=batch_id,
            repo="eval/x",
            payload=TaskSpec.model_validate(specs[i]),
            created_at=created,
            issue_number=i + 1,
        )
        for i in range(tasks)
    ]
    entry = {"client_id": "acme", "batch_id": batch_id, "balance_after": 0, "at": now}
    hold = LedgerEntry(amount=0, held_change=tasks, kind="hold", **entry)
    with app.store.transaction() as tx:
        tx.record_batch(batch, records, hold)
    passed = {"status": TaskStatus.PASSED, "finished_at": now, "result": {"score": 1}}
    app.store.update_tasks(batch_id, {f"t{i}": passed for i in range(tasks)})
    app.store.settle(
        [
            LedgerEntry(amount=-tasks, kind="charge", **entry),
            LedgerEntry(amount=0, held_change=-tasks, kind="release", **entry),
        ]
    )
    app.store.update_batch(batch_id, status=BatchStatus.EMITTED, done=tasks, completed_at=now)
    app.store.update_batch(batch_id, emitted_at=now)  # archives it


def history(home: Path, batches: int, tasks: int) -> tuple[App, tuple[Callable[[], object], ...]]:
    """A served state folder with `batches` overlapping archived batches; the reads."""
    app = build_app(load_settings(home=home, operator_key=KEY), with_forge=False)
    app.billing.add_client("acme", 10**12)
    for n in range(batches):
        add_overlapping(app, n, tasks)
    assert app.store.count_batches() == {"emitted": batches}
    server = BackgroundServer(create_web(app.web, lambda: {}), name="bench-web")
    url = server.start()
    session = requests.Session()
    session.post(f"{url}/operator/login", data={"key": KEY}, timeout=30).raise_for_status()
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {app.billing.new_api_key('acme')}"

    def view(path: str, **params: object) -> Callable[[], None]:
        return lambda: session.get(f"{url}{path}", params=params, timeout=60).raise_for_status()

    def api_page() -> None:
        got = api.get(f"{url}/api/eval/batches", params={"limit": PAGE}, timeout=60)
        assert got.headers["X-Total-Count"] == str(batches), got.headers
        assert len(got.json()) == min(PAGE, batches)

    return app, (
        view("/operator/batches", limit=PAGE),
        view("/operator/batches", limit=PAGE, page=2),
        api_page,
        lambda: app.store.page_batches(limit=PAGE),
        server.stop,
    )


def footprint(home: Path, batches: int) -> tuple[float, float, float, float]:
    """(files, bytes) per archived batch in the state folder, then in outbox/."""
    state_files = state_bytes = outbox_files = outbox_bytes = 0
    for folder, _dirs, names in os.walk(home):
        for name in names:
            size = (Path(folder) / name).stat().st_size
            if Path(folder).is_relative_to(home / "outbox"):
                outbox_files, outbox_bytes = outbox_files + 1, outbox_bytes + size
            elif not name.endswith(".lock"):  # lock stripes: a fixed set, not history
                state_files, state_bytes = state_files + 1, state_bytes + size
    per = max(batches, 1)
    return state_files / per, state_bytes / per, outbox_files / per, outbox_bytes / per


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--small", type=int, default=10)
    args_parser.add_argument("--large", type=int, default=2000)
    args_parser.add_argument("--tasks", type=int, default=3, help="tasks per batch")
    args_parser.add_argument("--calls", type=int, default=20)
    shm = Path("/dev/shm")
    args_parser.add_argument("--dir", default=str(shm) if shm.is_dir() else None)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("history_pages", command_line())
    names = (
        f"/operator/batches (first {PAGE})",
        f"/operator/batches (second {PAGE})",
        f"GET /api/eval/batches (first {PAGE} + total)",
        f"store page_batches (first {PAGE})",
    )
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as small_home,
        tempfile.TemporaryDirectory(dir=args.dir) as big_home,
    ):
        built = time.perf_counter()
        _, small = history(Path(small_home), args.small, args.tasks)
        _, large = history(Path(big_home), args.large, args.tasks)
        built = time.perf_counter() - built
        try:
            reads = dict(zip(names, zip(small[:4], large[:4], strict=True), strict=True))
            add_history_ratios(result, reads, args.small, args.large, calls=args.calls)
        finally:
            small[4]()
            large[4]()
        files, size, _, _ = footprint(Path(big_home), args.large)
        result.add("state files per archived batch", files, "files", "<= 1", files <= 1.0)
        result.add("state bytes per archived batch", size, "B", note=f"{args.tasks} tasks each")
    result.info["setup"] = (
        f"one client, {args.small} and {args.large} archived batches of {args.tasks} tasks, "
        f"all created before the first ended (full overlap), built in {built:.0f} s on "
        f"{args.dir or 'the temp folder'}; median of {args.calls} paired calls"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
