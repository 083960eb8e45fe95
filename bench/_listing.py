"""Listing cost against history: `batches`, `clients show` and the API listing with 5 and
with 2,000 archived batches, in one run.

The history is made by the store's own archive path (each batch: its summary row and its
hold, charge and release entries appended, the index counts updated), for one client, so
the figures are the cost of reading one page of 5 (what 5 archived batches hold): the
newest batches (`dropbox-eval batches --limit 5`), the newest ledger entries
(`dropbox-eval clients show ID --limit 5`), and the API's first page with its
`X-Total-Count` - each the median of 20 calls, through the store calls the CLI makes and
the real API over loopback HTTP.

Used by `bench/history.py` (`--listing-small`, `--listing-large`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import requests
from _common import BenchResult, add_history_ratios

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings
from dropbox_eval.models import BatchRecord, BatchStatus, LedgerEntry, utcnow
from dropbox_eval.store.archiving import count_archived
from dropbox_eval.store.rows import summary_row
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api

PAGE = 5  # the same page in both histories: a page of 50 rows costs more than one of 5


def history(home: Path, batches: int) -> tuple[Callable[[], object], ...]:
    """A state folder whose client `acme` has `batches` archived batches; the three reads."""
    app = build_app(load_settings(home=home))
    app.billing.add_client("acme", 10**9)
    now = utcnow()
    for n in range(batches):
        batch = BatchRecord(
            batch_id=f"20260101-000000-{n:09d}",
            client_id="acme",
            repo="eval/x",
            total=1,
            done=1,
            created_at=now,
            status=BatchStatus.EMITTED,
            emitted_at=now,
        )
        entries = [
            LedgerEntry(
                client_id="acme",
                amount=a,
                held_change=h,
                balance_after=0,
                kind=k,
                batch_id=batch.batch_id,
                at=now,
            ).model_dump(mode="json")
            for k, a, h in (("hold", 0, 1), ("charge", -1, 0), ("release", 0, -1))
        ]
        app.store.archive_rows.add(summary_row(batch), entries)
        with app.store._index_change() as data:  # noqa: SLF001 - counted as archive() does
            count_archived(data["counts"], batch)
    key = app.billing.new_api_key("acme")
    server = BackgroundServer(create_api(app.web), name="bench-api")
    url = server.start()
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    return (
        lambda: app.store.page_batches(limit=PAGE),
        lambda: app.store.ledger("acme", limit=PAGE),
        lambda: session.get(f"{url}/api/eval/batches", params={"limit": PAGE}, timeout=30),
        server.stop,
    )


def listing_figures(result: BenchResult, small_count: int, large_count: int) -> None:
    """The three listings' cost at `large_count` over `small_count` archived batches."""
    names = (
        f"batches --limit {PAGE}",
        f"clients show --limit {PAGE}",
        "GET /api/eval/batches (first page + total)",
    )
    with tempfile.TemporaryDirectory() as small_home, tempfile.TemporaryDirectory() as big_home:
        small = history(Path(small_home), small_count)
        large = history(Path(big_home), large_count)
        try:
            reads = dict(zip(names, zip(small[:3], large[:3], strict=True), strict=True))
            add_history_ratios(result, reads, small_count, large_count)
        finally:
            small[3]()
            large[3]()
    result.info["listing setup"] = (
        f"one client with {small_count} and {large_count} archived batches (3 ledger entries "
        "each), made through the store's archive; median of 20 calls"
    )
