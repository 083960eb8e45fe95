"""The archive: emitted batches' summary rows and ledger entries, append-only, per client.

`archive/batches.jsonl` holds every archived batch, and `archive/clients/<client_id>/`
holds that client's batches and ledger entries, so listing a client's newest page reads
that page from the end of one file: the cost follows the page, not the history. A crash
between appending and dropping the live rows appends the same rows again; readers keep
the first of each id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .files import append_lines, newest_lines, read_lines

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
        path = self._client(client_id, "batches") if client_id else self.folder / "batches.jsonl"
        yield from _first_of_each(newest_lines(path), "batch_id")

    def all_batches(self) -> list[Row]:
        """Every archived batch row, oldest first (reads the whole history)."""
        rows = list(_first_of_each(iter(read_lines(self.folder / "batches.jsonl")), "batch_id"))
        return rows

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
