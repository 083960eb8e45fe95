"""The engine's reads of many batches: listings, pages, counts, duplicates and the
snapshot of running totals. A listing's order is the TinyDB engine's: live batches newest
created first, then the history newest archived first (`archive_seq`, given under the
store lock as a batch is archived). A buried batch is in no listing and no count."""

from __future__ import annotations

from typing import Any

from ...models import BatchStatus, LedgerEntry
from .. import totals
from ..rows import BatchRow, HistoryPage
from .connection import Connection
from .reads import LEDGER_COLUMNS, client_of

CURSOR_PREFIX = "s"
RECENT_BAD = totals.RECENT_BAD


def _filters(
    client_id: str | None, status: BatchStatus | None, finished: bool = False
) -> tuple[list[str], list[Any]]:
    where, params = ["tombstone IS NULL"], []
    if client_id is not None:
        where.append("client_id = %s")
        params.append(client_id)
    if status is not None:
        where.append("status = %s")
        params.append(str(status))
    if finished:
        where.append("status <> %s")
        params.append(str(BatchStatus.RUNNING))
    return where, params


def list_batches(
    conn: Connection,
    *,
    live_only: bool,
    client_id: str | None,
    status: BatchStatus | None,
    batch_id: str | None,
    repo: str | None,
) -> list[BatchRow]:
    """Rows matching every filter, oldest first."""
    where, params = _filters(client_id, status)
    for column, value in (("batch_id", batch_id), ("repo_folded", repo and repo.casefold())):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    if live_only:
        where.append("archived_at IS NULL")
    rows = conn.execute(
        f"SELECT summary FROM batches WHERE {' AND '.join(where)} ORDER BY batch_id", params
    ).fetchall()
    return [BatchRow.model_validate(row["summary"]) for row in rows]


def page_batches(
    conn: Connection,
    *,
    client_id: str | None,
    status: BatchStatus | None,
    limit: int,
    offset: int,
    finished: bool,
    after: str | None,
) -> list[BatchRow]:
    """Live rows (newest created first), then archived ones (newest archived first): at
    most `offset + limit` rows read of each part, each part read on its own index."""
    where, params = _filters(client_id, status, finished)
    live_where, archived_where = [*where, "archived_at IS NULL"], [*where, "archive_seq > 0"]
    live_params, archived_params = list(params), list(params)
    if after is not None:
        found = conn.execute(
            "SELECT archive_seq FROM batches WHERE batch_id = %s AND tombstone IS NULL",
            (after,),
        ).fetchone()
        if found is None:
            return []
        if found["archive_seq"] is None:
            live_where.append("batch_id < %s")
            live_params.append(after)
        else:
            live_where.append("false")
            archived_where.append("archive_seq < %s")
            archived_params.append(found["archive_seq"])
    want = offset + limit
    rows = conn.execute(
        f"SELECT summary FROM batches WHERE {' AND '.join(live_where)}"
        " ORDER BY batch_id DESC LIMIT %s",
        [*live_params, want],
    ).fetchall()
    if len(rows) < want:
        rows += conn.execute(
            f"SELECT summary FROM batches WHERE {' AND '.join(archived_where)}"
            " ORDER BY archive_seq DESC LIMIT %s",
            [*archived_params, want - len(rows)],
        ).fetchall()
    return [BatchRow.model_validate(row["summary"]) for row in rows[offset:want]]


def history_page(
    conn: Connection,
    *,
    client_id: str | None,
    status: BatchStatus | None,
    limit: int,
    cursor: str | None,
) -> HistoryPage:
    """Archived rows newest archived first, from `cursor` (the last row's archive_seq)."""
    where, params = _filters(client_id, status)
    where.append("archive_seq > 0")
    if cursor is not None:
        where.append("archive_seq < %s")
        params.append(decode_cursor(cursor))
    rows = conn.execute(
        f"SELECT summary, archive_seq FROM batches WHERE {' AND '.join(where)}"
        " ORDER BY archive_seq DESC LIMIT %s",
        [*params, limit + 1],
    ).fetchall()
    page = rows[:limit]
    more = len(rows) > limit and page
    return HistoryPage(
        rows=[BatchRow.model_validate(row["summary"]) for row in page],
        next_cursor=f"{CURSOR_PREFIX}{page[-1]['archive_seq']}" if more else None,
    )


def decode_cursor(cursor: str) -> int:
    """The archive_seq a history cursor names; ValueError when it is none of ours."""
    if not cursor.startswith(CURSOR_PREFIX) or not cursor[1:].isdigit():
        raise ValueError(f"not a history cursor: {cursor!r}")
    return int(cursor[1:])


def count_batches(conn: Connection, client_id: str | None) -> dict[str, int]:
    """Batches per status, live and archived."""
    where, params = _filters(client_id, None)
    rows = conn.execute(
        f"SELECT status, count(*) AS n FROM batches WHERE {' AND '.join(where)} GROUP BY status",
        params,
    ).fetchall()
    return {row["status"]: row["n"] for row in rows}


def find_batch(
    conn: Connection, client_id: str, sha256: str | None, batch_ref: str | None
) -> str | None:
    """The client's earliest batch with these bytes (first) or this batch_ref."""
    if sha256 is None and batch_ref is None:
        return None
    row = conn.execute(
        "SELECT batch_id FROM batches WHERE client_id = %(client)s"
        " AND (sha256 = %(sha256)s OR batch_ref = %(ref)s)"
        " ORDER BY sha256 = %(sha256)s DESC NULLS LAST, batch_id LIMIT 1",
        {"client": client_id, "sha256": sha256, "ref": batch_ref},
    ).fetchone()
    return None if row is None else str(row["batch_id"])


def snapshot(conn: Connection) -> totals.Snapshot:
    """Live rows, the live ledger (entries of no batch or of a live one), clients, and the
    archive's totals (what erasing a batch keeps: its tasks, way in and charge count on)."""
    live = conn.execute(
        "SELECT summary FROM batches WHERE archived_at IS NULL ORDER BY batch_id"
    ).fetchall()
    ledger = conn.execute(
        f"SELECT {LEDGER_COLUMNS} FROM ledger WHERE NOT EXISTS (SELECT 1 FROM batches b"
        " WHERE b.batch_id = ledger.batch_id AND b.archived_at IS NOT NULL) ORDER BY seq"
    ).fetchall()
    clients = conn.execute("SELECT doc, balance, held FROM clients ORDER BY client_id")
    return totals.Snapshot(
        live=[row["summary"] for row in live],
        ledger=[LedgerEntry.model_validate(row).model_dump(mode="json") for row in ledger],
        clients=[client_of(row).model_dump(mode="json") for row in clients.fetchall()],
        archived=_archived_totals(conn),
    )


def _archived_totals(conn: Connection) -> totals.ArchivedTotals:
    found = totals.ArchivedTotals()
    for row in conn.execute(
        "SELECT status, summary->>'source' AS source, count(*) AS n, bool_and(tombstone IS"
        " NULL) AS kept FROM batches WHERE archive_seq > 0 GROUP BY 1, 2, tombstone IS NULL"
    ):
        source = totals.source_of({"source": row["source"]})
        found.sources[source] = found.sources.get(source, 0) + row["n"]
        if row["kept"]:
            found.batches[row["status"]] = found.batches.get(row["status"], 0) + row["n"]
    for row in conn.execute(
        "SELECT key, sum(value::bigint) AS n FROM batches, jsonb_each_text(task_counts)"
        " WHERE archive_seq > 0 GROUP BY key"
    ):
        found.tasks[row["key"]] = int(row["n"])
    for row in conn.execute(
        "SELECT client_id, -sum(amount) AS n FROM ledger WHERE kind = 'charge' AND EXISTS"
        " (SELECT 1 FROM batches b WHERE b.batch_id = ledger.batch_id AND b.archive_seq > 0)"
        " GROUP BY client_id"
    ):
        found.charged[row["client_id"]] = int(row["n"])
    bad = conn.execute(
        "SELECT summary FROM batches WHERE archive_seq > 0 AND status = ANY(%s)"
        " ORDER BY archive_seq DESC LIMIT %s",
        (list(totals.BAD_STATUSES), RECENT_BAD),
    ).fetchall()
    found.recent_bad = [row["summary"] for row in reversed(bad)]
    return found
