"""Listing batches: summary rows from the index and the archive, pages whose cost follows
the page and not the history, counts per status, and the duplicate lookup."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..models import BatchStatus
from . import paging
from .base import Row
from .clients import ClientStore


class BatchListing(ClientStore):
    """The store's reads of many batches at once."""

    def list_batches(
        self, where: Callable[[Row], bool] | None = None, *, live_only: bool = False
    ) -> list[Row]:
        """Summary rows, oldest first. `live_only` reads only the index (batches not yet
        emitted); without it the whole archive is read: use `page_batches` for listings."""
        rows = {r["batch_id"]: r for r in self._live_rows()}
        if not live_only:
            for row in self.archive_rows.all_batches():
                rows.setdefault(row["batch_id"], paging.public(row))
        chosen = [r for r in rows.values() if where is None or where(r)]
        return sorted(chosen, key=lambda r: str(r["batch_id"]))

    def live_repos(self) -> set[str]:
        """The repos (case-folded) of batches not yet emitted: one read of the index."""
        return {str(row["repo"]).casefold() for row in self._live_rows()}

    def page_batches(
        self,
        *,
        client_id: str | None = None,
        status: str | None = None,
        limit: int = 50,
        offset: int = 0,
        finished: bool = False,
        matches: int | None = None,
    ) -> list[Row]:
        """One page of summary rows, newest created first (a running batch among them by
        its creation time, unless `finished`); the cost follows `offset + limit`, not the
        history. `matches`: how many rows the filter matches in all (`count_batches`), if
        known; the read stops once it has seen them (paging.newest_page)."""

        def keep(row: Row) -> bool:
            if finished and row["status"] == BatchStatus.RUNNING:
                return False
            return client_id in (None, row["client_id"]) and status in (None, row["status"])

        archived = self.archive_rows.newest_batches(client_id)
        return paging.newest_page(
            self._live_rows(), archived, keep, limit=limit, offset=offset, matches=matches
        )

    def count_batches(self, client_id: str | None = None) -> dict[str, int]:
        """Batches per status (live and archived), for everyone or one client, from the
        index alone."""
        with self._index() as db:
            counts_doc: dict[str, Any] = dict(db.table("counts").get(doc_id=1) or {})
        counts = dict(counts_doc.get(f"client:{client_id}" if client_id else "all", {}))
        for row in self._live_rows():
            if client_id is None or row["client_id"] == client_id:
                counts[row["status"]] = counts.get(row["status"], 0) + 1
        return counts

    def find_batch(
        self, client_id: str, *, sha256: str | None = None, batch_ref: str | None = None
    ) -> str | None:
        """The id of an earlier batch of this client with the same bytes or batch_ref: an
        archived one by its key, a live one by its index row."""
        for key in duplicate_keys(sha256, batch_ref):
            path = self.keys_dir / client_id / key
            with contextlib.suppress(FileNotFoundError):
                return path.read_text(encoding="utf-8").strip()

        def same(row: Row) -> bool:
            return row["client_id"] == client_id and bool(
                (sha256 and row.get("sha256") == sha256)
                or (batch_ref and row.get("batch_ref") == batch_ref)
            )

        found = self.list_batches(same, live_only=True)  # a crash before the keys were written
        return str(found[0]["batch_id"]) if found else None


def duplicate_keys(sha256: str | None, batch_ref: str | None) -> list[str]:
    """The names under `keys/<client_id>/` that find a batch by its bytes or its ref."""
    return ([f"sha256-{sha256}"] if sha256 else []) + ([f"ref-{batch_ref}"] if batch_ref else [])
