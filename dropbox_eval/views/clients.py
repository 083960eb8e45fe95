"""The views of a client account and its ledger."""

from __future__ import annotations

from typing import Any

from ..models import Client, LedgerEntry
from ..util.timestamps import rfc3339


def client_view(client: Client, charged: int | None = None) -> dict[str, Any]:
    """Balance, held, available, how many API keys (never the secret or the key hashes) and,
    when known, the credits charged so far."""
    data = client.model_dump(mode="json", exclude={"api_key_hashes", "webhook_secret"})
    data["created_at"] = rfc3339(client.created_at)
    data["available"] = client.available
    data["api_keys"] = len(client.api_key_hashes)
    if charged is not None:
        data["charged"] = charged
    return data


def ledger_view(entry: LedgerEntry) -> dict[str, Any]:
    """One money movement; `moved` is the balance change, or for a hold or a release (which
    leave the balance alone) the change of the held amount."""
    data = entry.model_dump(mode="json")
    data["at"] = rfc3339(entry.at)
    data["moved"] = entry.amount or entry.held_change
    return data
