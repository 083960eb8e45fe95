"""Listing batches: summary rows from the index and the archive, pages whose cost follows
the page and not the history, counts per status, and the duplicate lookup."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..models import BatchStatus
from . import paging
from .rows import BatchRow, HistoryPage, Row, duplicate_keys

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others


class BatchListing(_Base):
    """The store's reads of many batches at once."""

    def list_batches(
        self,
        *,
        live_only: bool = False,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        batch_id: str | None = None,
        repo: str | None = None,
    ) -> list[BatchRow]:
        """Rows matching every filter given, oldest first. `live_only` reads only the index
        (batches not yet archived); without it the whole archive is read: use
        `page_batches` for listings."""
        wanted = {"client_id": client_id, "status": status, "batch_id": batch_id}
        rows = {r["batch_id"]: r for r in self._live_rows()}
        if not live_only:
            for row in self.archive_rows.all_batches():
                rows.setdefault(row["batch_id"], paging.public(row))
        chosen = [
            BatchRow.model_validate(r)
            for r in rows.values()
            if all(value in (None, r[key]) for key, value in wanted.items())
            and (repo is None or str(r["repo"]).casefold() == repo.casefold())
        ]
        return sorted(chosen, key=lambda r: r.batch_id)

    def live_repos(self) -> set[str]:
        """The repos (case-folded) of batches not yet emitted: one read of the index."""
        return {str(row["repo"]).casefold() for row in self._live_rows()}

    def page_batches(
        self,
        *,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        limit: int = 50,
        offset: int = 0,
        finished: bool = False,
        matches: int | None = None,
        after: str | None = None,
    ) -> list[BatchRow]:
        """One page of summary rows: the live batches first (newest created first), then
        the archived ones, newest ended first (paging.py); only ended ones if `finished`.
        The cost follows `offset + limit`, not the history nor how its batches overlapped
        in time. `matches`: how many rows the filter matches in all (`count_batches`), if
        known; the read stops once it has seen them. `after`: a cursor, only the rows that
        follow that batch's row in this order (read up to it, like an offset:
        `history_page`'s cursor costs only its page)."""

        def keep(row: Row) -> bool:
            if finished and row["status"] == BatchStatus.RUNNING:
                return False
            return client_id in (None, row["client_id"]) and status in (None, row["status"])

        archived = self.archive_rows.newest_batches(client_id)
        page = paging.newest_page(
            self._live_rows(),
            archived,
            keep,
            limit=limit,
            offset=offset,
            matches=matches,
            after=after,
        )
        return [BatchRow.model_validate(row) for row in page]

    def history_page(
        self,
        *,
        client_id: str | None = None,
        status: BatchStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> HistoryPage:
        """Archived batches only, newest ended first, from `cursor` (the first page if
        None): the page and the next page's cursor (None after the last). The cursor is
        the offset of the page's last row in the archive file, which appending (new
        batches, tombstones) never moves: a page's cost is its rows (plus the rows a
        `status` filter passes over), never the history before it."""
        end = paging.decode_cursor(cursor)
        rows: list[BatchRow] = []
        last = None
        for offset, row in self.archive_rows.batches_before(client_id, end):
            if status is not None and row["status"] != status:
                continue
            if self.history.tombstone(str(row["batch_id"])) is not None:
                continue  # buried after this cursor was handed out
            if len(rows) == limit:
                return HistoryPage(rows=rows, next_cursor=paging.encode_cursor(last))
            rows.append(BatchRow.model_validate(paging.public(row)))
            last = offset
        return HistoryPage(rows=rows, next_cursor=None)

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

        found = [  # live, or a crash came before the keys were written
            str(row["batch_id"])
            for row in self._live_rows()
            if row["client_id"] == client_id
            and (
                (sha256 and row.get("sha256") == sha256)
                or (batch_ref and row.get("batch_ref") == batch_ref)
            )
        ]
        return min(found, default=None)
