"""The archive: emitted batches' summary rows and ledger entries, append-only, per client.

`archive/batches.jsonl` holds every archived batch, and `archive/clients/<client_id>/`
holds that client's batches and ledger entries, so listing a client's newest page reads
that page from the end of one file: the cost follows the page, not the history. A crash
between appending and dropping the live rows appends the same rows again; readers keep
the first of each id. A batch removed for good gets a tombstone row (`bury`), which
hides its earlier rows from every reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .files import append_lines, newest_lines, newest_lines_at, read_lines

Row = dict[str, Any]


class Archive:
    """Append-only history under `state/archive/`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _client(self, client_id: str, kind: str) -> Path:
        return self.folder / "clients" / client_id / f"{kind}.jsonl"

    def add(self, summary: Row, entries: list[Row]) -> None:
        """Archive one batch's summary row and its ledger entries."""
        client_id = str(summary["client_id"])
        append_lines(self._client(client_id, "ledger"), entries)
        append_lines(self._client(client_id, "batches"), [summary])
        append_lines(self.folder / "batches.jsonl", [summary])

    def newest_batches(self, client_id: str | None = None) -> Iterator[Row]:
        """Archived batch rows, newest first (one client's, or everyone's)."""
        for _offset, row in self.batches_before(client_id):
            yield row

    def batches_before(
        self, client_id: str | None = None, end: int | None = None
    ) -> Iterator[tuple[int, Row]]:
        """(offset, row) of the archived batch rows that start before `end` in the
        archive file (the end if None), newest archived first, buried ones left out: an
        offset is a cursor into the history's order, which appending never moves."""
        path = self._client(client_id, "batches") if client_id else self.folder / "batches.jsonl"
        seen: set[str] = set()
        for offset, row in newest_lines_at(path, end):
            batch_id = str(row.get("batch_id"))
            if batch_id not in seen:
                seen.add(batch_id)
                if not row.get("tombstone"):
                    yield offset, row

    def bury(self, batch_id: str, client_id: str, at: str) -> None:
        """Hide an archived batch's rows from every listing (a tombstone row each)."""
        tombstone = {"batch_id": batch_id, "client_id": client_id, "tombstone": at}
        append_lines(self._client(client_id, "batches"), [tombstone])
        append_lines(self.folder / "batches.jsonl", [tombstone])

    def all_batches(self) -> list[Row]:
        """Every archived batch row, oldest first (reads the whole history)."""
        rows = read_lines(self.folder / "batches.jsonl")
        buried = {row.get("batch_id") for row in rows if row.get("tombstone")}
        return [r for r in _first_of_each(iter(rows), "batch_id") if r["batch_id"] not in buried]

    def all_ledger(self) -> Iterator[Row]:
        """Every client's archived ledger entries (reads the whole history)."""
        for folder in sorted((self.folder / "clients").glob("*")):
            path = folder / "ledger.jsonl"
            yield from _first_of_each(iter(read_lines(path)), "entry_id")

    def newest_ledger(self, client_id: str) -> Iterator[Row]:
        """A client's archived ledger entries, newest first."""
        yield from _first_of_each(newest_lines(self._client(client_id, "ledger")), "entry_id")


def _first_of_each(rows: Iterator[Row], key: str) -> Iterator[Row]:
    seen: set[str] = set()
    for row in rows:
        if row.get(key) not in seen:
            seen.add(str(row.get(key)))
            yield row
