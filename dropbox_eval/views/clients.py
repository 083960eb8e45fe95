"""The views of a client account and its ledger."""

from __future__ import annotations

from typing import Any

from ..models import ApiKey, Client, LedgerEntry
from ..util.timestamps import rfc3339


def client_view(client: Client, charged: int | None = None) -> dict[str, Any]:
    """Balance, held, available, its standing (`active`, `disabled`, `removed`), how many
    API keys (never the secret or the key hashes) and, when known, the credits charged."""
    data = client.model_dump(mode="json", exclude={"api_keys", "webhook_secret"})
    for moment in ("created_at", "disabled_at", "removed_at"):
        data[moment] = rfc3339(getattr(client, moment))
    data["state"] = standing(client)
    data["available"] = client.available
    data["api_keys"] = len(client.api_keys)
    if charged is not None:
        data["charged"] = charged
    return data


def standing(client: Client) -> str:
    """`removed`, `disabled` or `active` (billing/standing.py)."""
    if client.removed_at is not None:
        return "removed"
    return "disabled" if client.disabled_at is not None else "active"


def key_view(key: ApiKey) -> dict[str, Any]:
    """One API key as listed: id, issue and last-use times; never the key or its hash."""
    return {
        "key_id": key.key_id,
        "kind": "api",
        "created_at": rfc3339(key.created_at),
        "last_used_at": rfc3339(key.last_used_at),
    }


def ledger_view(entry: LedgerEntry) -> dict[str, Any]:
    """One money movement; `moved` is the balance change, or for a hold or a release (which
    leave the balance alone) the change of the held amount."""
    data = entry.model_dump(mode="json")
    data["at"] = rfc3339(entry.at)
    data["moved"] = entry.amount or entry.held_change
    return data
