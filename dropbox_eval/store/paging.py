"""Pages of batch summary rows at the cost of the page, whatever the history.

A listing's order: the live batches first, newest created first (there are only as many as
the live work), then the history, newest ended first: the order of the archive file, read
from its end, `(ended_at, batch_id)` descending as archived (`archived_at`). A batch that
ran for an hour is listed among the batches that ended when it did, so a page never waits
on batches that overlapped it in time: reading stops once the page is full.

A cursor into the history is the offset of the last row taken in the archive file
(appending never moves a row), so the next page starts there: its cost is that page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

Row = dict[str, Any]


def newest_page(
    live: Iterable[Row],
    archived_newest_first: Iterable[Row],
    keep: Callable[[Row], bool],
    *,
    limit: int,
    offset: int = 0,
    matches: int | None = None,
    after: str | None = None,
) -> list[Row]:
    """Rows `keep` accepts, live ones first (newest created first), then archived ones
    (newest ended first), `offset` skipped, at most `limit`; a live row wins over an
    archived copy of the same batch (a crash between the two writes). `matches`: how many
    rows `keep` accepts in all (the index's counts), if known: the read stops once it has
    seen them. `after`: only the rows that follow this batch's row in the order (the rows
    up to it are read, like an offset)."""
    want = offset + limit
    live_rows = sorted(live, key=lambda r: str(r["batch_id"]), reverse=True)
    seen = {str(r["batch_id"]) for r in live_rows}
    passed = after is None
    page: list[Row] = []
    found = 0
    if matches == 0:
        return []
    for row in _chain(live_rows, archived_newest_first, seen):
        if not passed:
            passed = str(row["batch_id"]) == after
            continue
        if keep(row):
            found += 1
            page.append(row)
        if len(page) >= want or (matches is not None and found >= matches):
            break
    return [public(row) for row in page[offset:want]]


def _chain(live: list[Row], archived: Iterable[Row], seen: set[str]) -> Iterator[Row]:
    yield from live
    for row in archived:
        if str(row["batch_id"]) not in seen:
            seen.add(str(row["batch_id"]))
            yield row


def public(row: Row) -> Row:
    """A summary row as listings show it (without the archive's own `archived_at`)."""
    return {k: v for k, v in row.items() if k != "archived_at"}


def encode_cursor(offset: int | None) -> str | None:
    """The cursor of the history page after the row at `offset` of the archive file."""
    return None if offset is None else f"h{offset}"


def decode_cursor(cursor: str | None) -> int | None:
    """The archive file offset a cursor names (None: from the end); ValueError when it
    is no cursor of `encode_cursor`."""
    if cursor is None:
        return None
    if not cursor.startswith("h") or not cursor[1:].isdigit():
        raise ValueError(f"not a history cursor: {cursor!r}")
    return int(cursor[1:])
