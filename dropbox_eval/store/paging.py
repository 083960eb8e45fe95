"""One page of batch summary rows, newest first by creation time, at the cost of the page.

The archive is appended in the order batches were archived, not created: a batch that ran
for an hour is archived after batches created later. Reading it backwards, every row still
unread was archived (and so created) no later than the row in hand, so once the page is
full of rows created at or after that moment nothing unread can belong on it: the read
stops there. The cost follows the page plus the batches archived while its oldest row was
running, not the history.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

Row = dict[str, Any]


def _moment(row: Row, *fields: str) -> datetime | None:
    """The first of `fields` the row holds, as a datetime (None: none of them)."""
    value = next((row[f] for f in fields if row.get(f)), None)
    return datetime.fromisoformat(str(value)) if value else None


def newest_page(
    live: Iterable[Row],
    archived_newest_first: Iterable[Row],
    keep: Callable[[Row], bool],
    *,
    limit: int,
    offset: int = 0,
    matches: int | None = None,
) -> list[Row]:
    """Rows `keep` accepts, newest created first, `offset` skipped, at most `limit`; a live
    row wins over an archived copy of the same batch (a crash between the two writes).
    `matches`: how many rows `keep` accepts in all (the index's counts), if known: the read
    stops once it has seen them, so a filter that few rows pass reads no further back than
    its oldest match."""
    want = offset + limit
    found: dict[str, Row] = {}
    newest: list[tuple[str, datetime | None]] = []  # min-heap: the `want` newest ids kept

    def take(row: Row) -> None:
        found[str(row["batch_id"])] = row
        heapq.heappush(newest, (str(row["batch_id"]), _moment(row, "created_at")))
        if len(newest) > want:
            heapq.heappop(newest)

    seen: set[str] = set()
    for row in live:
        seen.add(str(row["batch_id"]))
        if keep(row):
            take(row)

    def all_seen() -> bool:
        return matches is not None and len(found) >= matches

    for row in () if all_seen() else archived_newest_first:
        if str(row["batch_id"]) not in seen and keep(row):
            seen.add(str(row["batch_id"]))
            take(row)
        if all_seen() or (len(newest) >= want and _nothing_older_fits(row, newest[0][1])):
            break
    page = sorted(found.values(), key=lambda r: str(r["batch_id"]), reverse=True)
    return [public(row) for row in page[offset:want]]


def public(row: Row) -> Row:
    """A summary row as listings show it (without the archive's own `archived_at`)."""
    return {k: v for k, v in row.items() if k != "archived_at"}


def _nothing_older_fits(row: Row, oldest_kept: datetime | None) -> bool:
    """Whether no row archived before `row` (unread yet) can be newer than `oldest_kept`:
    each was archived (so created) no later than `row` was archived. A row without these
    times (none are written so) trusts the file's order."""
    archived = _moment(row, "archived_at", "emitted_at")
    return archived is None or oldest_kept is None or archived <= oldest_kept
