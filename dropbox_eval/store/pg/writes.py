"""The engine's writes, each on the connection of an open transaction: a batch with its
tasks, a change of a batch or of its tasks, clients and the ledger, archiving and burying.
A batch's derived columns (status, repo, summary) are written with its record, always."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

from ...errors import NotFoundError, StoreError
from ...models import BatchRecord, Client, LedgerEntry, TaskRecord, utcnow
from ..audit import AuditEntry
from ..rows import dump, summary_row
from .connection import Connection

# jsonb holds neither U+0000 nor a lone surrogate (a lane's comment may carry either):
# each is kept as U+FFFD
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def jsonb(value: Any) -> Jsonb:
    """A value as a jsonb parameter (models, times and enums as the JSON files hold them)."""
    return Jsonb(value, dumps=_json_text)


def _json_text(value: Any) -> str:
    try:
        text = to_json(value).decode()
    except PydanticSerializationError:  # a lone surrogate, or an integer past 64 bits
        text = json.dumps(to_jsonable_python(value), ensure_ascii=False)
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return _NUL.sub(r"\1\\ufffd", text)


def _batch_columns(batch: BatchRecord) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id,
        "client_id": batch.client_id,
        "status": str(batch.status),
        "repo_folded": batch.repo.casefold(),
        "summary": jsonb(summary_row(batch)),
        "record": jsonb(dump(batch)),
    }


def insert_batch(conn: Connection, batch: BatchRecord, tasks: list[TaskRecord]) -> None:
    """A new batch's row and its tasks' rows."""
    conn.execute(
        "INSERT INTO batches (batch_id, client_id, status, repo_folded, summary, record,"
        " sha256, batch_ref) VALUES (%(batch_id)s, %(client_id)s, %(status)s,"
        " %(repo_folded)s, %(summary)s, %(record)s, %(sha256)s, %(batch_ref)s)",
        {**_batch_columns(batch), "sha256": batch.sha256, "batch_ref": batch.batch_ref},
    )
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO tasks (batch_id, position, task_id, doc) VALUES (%s, %s, %s, %s)",
            [(batch.batch_id, n, t.task_id, jsonb(dump(t))) for n, t in enumerate(tasks)],
        )


def change_batch(
    conn: Connection,
    batch_id: str,
    fields: dict[str, Any],
    when: Callable[[BatchRecord], bool] | None = None,
) -> tuple[BatchRecord, bool]:
    """The batch's row locked, read, changed unless `when` refuses it: the record as it is
    now, and whether it changed. NotFoundError when unknown (or buried)."""
    row = conn.execute(
        "SELECT record FROM batches WHERE batch_id = %s AND record IS NOT NULL FOR UPDATE",
        (batch_id,),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no batch {batch_id!r}")
    current = BatchRecord.model_validate(row["record"])
    if when is not None and not when(current):
        return current, False
    batch = BatchRecord.model_validate({**row["record"], **fields})
    conn.execute(
        "UPDATE batches SET status = %(status)s, repo_folded = %(repo_folded)s,"
        " summary = %(summary)s, record = %(record)s WHERE batch_id = %(batch_id)s",
        _batch_columns(batch),
    )
    return batch, True


def change_tasks(conn: Connection, batch_id: str, changes: dict[str, dict[str, Any]]) -> None:
    """Fields of the batch's tasks merged into their rows (in task_id order: two changes
    of the same tasks lock them in the same order)."""
    with conn.cursor() as cursor:
        cursor.executemany(
            "UPDATE tasks SET doc = doc || %s WHERE batch_id = %s AND task_id = %s",
            [(jsonb(changes[tid]), batch_id, tid) for tid in sorted(changes)],
        )


def add_client(conn: Connection, client: Client) -> None:
    """A new client's row."""
    doc = dump(client)
    conn.execute(
        "INSERT INTO clients (client_id, balance, held, created_at, doc)"
        " VALUES (%s, %s, %s, %s, %s)",
        (client.client_id, client.balance, client.held, client.created_at, jsonb(doc)),
    )


def change_client(conn: Connection, client_id: str, fields: dict[str, Any]) -> None:
    """Client fields other than money, merged into its row."""
    money = {"balance", "held"} & fields.keys()
    if money:
        raise StoreError(f"{sorted(money)} change only through ledger entries")
    conn.execute(
        "UPDATE clients SET doc = doc || %s WHERE client_id = %s", (jsonb(fields), client_id)
    )


def post_entry(conn: Connection, entry: LedgerEntry) -> None:
    """Move the client's balance and held credits by the entry (its row locked by the
    update) and add the entry with the amounts after it and the posting time."""
    moved = conn.execute(
        "UPDATE clients SET balance = balance + %s, held = held + %s WHERE client_id = %s"
        " RETURNING balance, held",
        (entry.amount, entry.held_change, entry.client_id),
    ).fetchone()
    if moved is None:
        raise StoreError(f"ledger entry for unknown client {entry.client_id!r}")
    conn.execute(
        "INSERT INTO ledger (entry_id, client_id, kind, amount, held_change, balance_after,"
        " held_after, batch_id, note, at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            entry.entry_id,
            entry.client_id,
            entry.kind,
            entry.amount,
            entry.held_change,
            moved["balance"],
            moved["held"],
            entry.batch_id,
            entry.note,
            utcnow(),
        ),
    )


def settle(conn: Connection, entries: list[LedgerEntry]) -> bool:
    """Post a batch's settlement unless a row of the same batch and kind is there: the
    ledger's unique key refuses the second, and its savepoint undoes the first's moves."""
    if not entries:
        return False
    try:
        with conn.transaction():  # a savepoint inside the caller's transaction
            for entry in entries:
                post_entry(conn, entry)
    except psycopg.errors.UniqueViolation:
        return False
    return True


def archive(conn: Connection, batch_id: str) -> bool:
    """A live batch's row marked archived, in the history's order, with its tasks per
    status kept for the running totals; False when it was not live."""
    cursor = conn.execute(
        "UPDATE batches SET archived_at = now(), archive_seq = nextval('history_order'),"
        " task_counts = (SELECT coalesce(jsonb_object_agg(status, n), '{}') FROM"
        "  (SELECT doc->>'status' AS status, count(*) AS n FROM tasks WHERE batch_id = %s"
        "   GROUP BY 1) AS per_status)"
        " WHERE batch_id = %s AND archived_at IS NULL AND record IS NOT NULL",
        (batch_id, batch_id),
    )
    return cursor.rowcount == 1


def bury(conn: Connection, batch_id: str, reason: str, keep: dict[str, Any] | None = None) -> bool:
    """An archived batch's record and tasks replaced by its tombstone (`keep`, else a bare
    one), in one statement; False when it is live, unknown or buried already."""
    cursor = conn.execute(
        "UPDATE batches SET record = NULL, report = NULL,"
        " tombstone = coalesce(%s, jsonb_build_object("
        "'at', %s::text, 'reason', %s::text, 'status', status)) WHERE batch_id = %s"
        " AND archived_at IS NOT NULL AND tombstone IS NULL",
        (None if keep is None else jsonb(keep), utcnow().isoformat(), reason, batch_id),
    )
    if cursor.rowcount != 1:
        return False
    conn.execute("DELETE FROM tasks WHERE batch_id = %s", (batch_id,))
    return True


def forget_keys(conn: Connection, batch_id: str) -> None:
    """A buried batch's duplicate keys gone (the same bytes dropped again make a new
    batch)."""
    conn.execute(
        "UPDATE batches SET sha256 = NULL, batch_ref = NULL"
        " WHERE batch_id = %s AND tombstone IS NOT NULL",
        (batch_id,),
    )


def add_action(conn: Connection, entry: AuditEntry) -> None:
    """One operator action appended to the audit log."""
    conn.execute(
        "INSERT INTO audit_log (at, actor, via, action, target, result, key_id, detail)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (
            entry.at,
            entry.actor,
            entry.via,
            entry.action,
            entry.target,
            entry.result,
            entry.key_id,
            jsonb(entry.detail),
        ),
    )
