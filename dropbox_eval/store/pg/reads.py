"""The engine's reads of one thing: a batch, its tasks, a client, a client's ledger, the
audit log. Each runs on the connection given: a transaction's (its own changes seen) or
one of the pool's (what has landed)."""

from __future__ import annotations

from typing import Any

from ...errors import NotFoundError
from ...models import BatchRecord, Client, LedgerEntry, TaskRecord
from ..audit import AuditEntry
from .connection import Connection

LEDGER_COLUMNS = (
    "entry_id, client_id, kind, amount, held_change, balance_after, held_after, batch_id, note, at"
)


def get_batch(conn: Connection, batch_id: str) -> BatchRecord:
    """The batch record; NotFoundError when unknown or buried."""
    row = conn.execute(
        "SELECT record FROM batches WHERE batch_id = %s AND record IS NOT NULL", (batch_id,)
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no batch {batch_id!r}")
    return BatchRecord.model_validate(row["record"])


def get_tasks(conn: Connection, batch_id: str) -> list[TaskRecord]:
    """The batch's tasks in their order; NotFoundError when the batch is unknown."""
    rows = conn.execute(
        "SELECT doc FROM tasks WHERE batch_id = %s ORDER BY position", (batch_id,)
    ).fetchall()
    if not rows:
        get_batch(conn, batch_id)  # NotFoundError, or a batch without tasks
    return [TaskRecord.model_validate(row["doc"]) for row in rows]


def get_report(conn: Connection, batch_id: str) -> bytes | None:
    """The report fixed at the batch's close; None before it (or for an unknown batch)."""
    row = conn.execute("SELECT report FROM batches WHERE batch_id = %s", (batch_id,)).fetchone()
    return None if row is None or row["report"] is None else bytes(row["report"])


def issue_numbers(conn: Connection, batch_id: str) -> dict[str, int | None]:
    """task_id -> issue number (None: none yet), in task order."""
    rows = conn.execute(
        "SELECT task_id, (doc->>'issue_number')::integer AS issue FROM tasks"
        " WHERE batch_id = %s ORDER BY position",
        (batch_id,),
    ).fetchall()
    if not rows:
        get_batch(conn, batch_id)
    return {row["task_id"]: row["issue"] for row in rows}


def client_of(row: dict[str, Any]) -> Client:
    """A client row as the model (its money from the columns)."""
    return Client.model_validate({**row["doc"], "balance": row["balance"], "held": row["held"]})


def get_client(conn: Connection, client_id: str) -> Client | None:
    """The client, or None."""
    row = conn.execute(
        "SELECT doc, balance, held FROM clients WHERE client_id = %s", (client_id,)
    ).fetchone()
    return None if row is None else client_of(row)


def list_clients(conn: Connection) -> list[Client]:
    """Every client, by id."""
    rows = conn.execute("SELECT doc, balance, held FROM clients ORDER BY client_id").fetchall()
    return [client_of(row) for row in rows]


def ledger(conn: Connection, client_id: str, limit: int | None) -> list[LedgerEntry]:
    """The client's newest `limit` entries (all: None), oldest first."""
    rows = conn.execute(
        f"SELECT * FROM (SELECT seq, {LEDGER_COLUMNS} FROM ledger WHERE client_id = %s"
        " ORDER BY seq DESC LIMIT %s) AS newest ORDER BY seq",
        (client_id, limit),
    ).fetchall()
    return [LedgerEntry.model_validate(row) for row in rows]


def audit_entries(conn: Connection, limit: int | None) -> list[AuditEntry]:
    """The newest `limit` operator actions (all: None), oldest first."""
    rows = conn.execute(
        "SELECT * FROM (SELECT seq, at, actor, via, action, target, result, key_id, detail"
        " FROM audit_log ORDER BY seq DESC LIMIT %s) AS newest ORDER BY seq",
        (limit,),
    ).fetchall()
    return [AuditEntry.model_validate(row) for row in rows]
