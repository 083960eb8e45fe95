"""Clients and their ledger: balances change only through ledger entries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tinydb import Query

from ..errors import StoreError
from ..models import Client, LedgerEntry, utcnow
from .rows import dump, insert

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others


class ClientStore(_Base):
    """Client accounts, the live ledger and each client's archived ledger."""

    def get_client(self, client_id: str) -> Client | None:
        """The client, or None when unknown."""
        with self._index() as db:  # search(), not get(cond): get reads the table twice
            rows = db.table("clients").search(Query().client_id == client_id)
        return Client.model_validate(rows[0]) if rows else None

    def list_clients(self) -> list[Client]:
        """Every client, sorted by id."""
        with self._index() as db:
            rows = db.table("clients").all()
        return sorted((Client.model_validate(r) for r in rows), key=lambda c: c.client_id)

    def add_client(self, client: Client) -> None:
        """Create a client; the caller holds the lock and checked it is new."""
        with self._index_change() as data:
            insert(data["clients"], dump(client))

    def post_ledger(self, entry: LedgerEntry) -> None:
        """Append a ledger entry and apply its amount and held change to the client."""
        with self._index_change() as data:
            post_entry(data, entry)

    def update_client(self, client_id: str, **fields: Any) -> None:
        """Change client fields other than money (secrets, API key hashes)."""
        with self._index_change() as data:
            for client in data["clients"].values():
                if client["client_id"] == client_id:
                    client.update(fields)

    def settle(self, entries: list[LedgerEntry]) -> bool:
        """Post a batch's settlement entries once; False if that batch was already settled."""
        with self._index_change() as data:
            return settle_once(data, entries)

    def ledger(self, client_id: str, limit: int | None = None) -> list[LedgerEntry]:
        """The client's newest `limit` ledger entries (all without a limit), oldest first.
        Costs the entries returned plus the live ledger, not the client's history."""
        with self._index() as db:
            live = db.table("ledger").search(Query().client_id == client_id)
        rows: list[dict[str, Any]] = [dict(r) for r in live]
        seen = {r["entry_id"] for r in rows}
        archived = 0  # the archive is newest first: `limit` of it can hold the newest
        for row in self.archive_rows.newest_ledger(client_id):
            if limit is not None and archived >= limit:
                break
            if row["entry_id"] not in seen:
                rows.append(dict(row))
                archived += 1
        rows.sort(key=lambda r: str(r["at"]))
        chosen = rows if limit is None else rows[-limit:]
        return [LedgerEntry.model_validate(r) for r in chosen]


def post_entry(data: dict[str, dict[str, Any]], entry: LedgerEntry) -> None:
    """Apply the entry's changes to the client as it is in `data` (read under the lock) and
    record the resulting balance and held amount, and the posting time, in the entry."""
    for client in data["clients"].values():
        if client["client_id"] == entry.client_id:
            client["balance"] += entry.amount
            client["held"] = client.get("held", 0) + entry.held_change
            insert(
                data["ledger"],
                {
                    **dump(entry),
                    "balance_after": client["balance"],
                    "held_after": client["held"],
                    "at": utcnow().isoformat(),
                },
            )
            return
    raise StoreError(f"ledger entry for unknown client {entry.client_id!r}")


def settle_once(data: dict[str, dict[str, Any]], entries: list[LedgerEntry]) -> bool:
    """Post a batch's settlement (its charge and the release of its hold) into `data`
    unless its release is there already; False when nothing was posted."""
    if not entries:
        return False
    batch_id = entries[0].batch_id
    if any(
        e.get("batch_id") == batch_id and e["kind"] == "release" for e in data["ledger"].values()
    ):
        return False
    for entry in entries:
        post_entry(data, entry)
    return True
