"""A client's account as stored: the client, its API keys and its ledger entries (the
money moves only through these). Re-exported by `models`, the data model's one name."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

LedgerKind = Literal["fund", "hold", "charge", "release", "write_off"]

LEGACY_KEY_PREFIX = "ak_"
"""A key issued before keys had ids is named by this and the start of its hash."""


class ApiKey(BaseModel):
    """One API key of a client: its id, the sha256 of the key (never the key), when it was
    issued (None: before keys had ids) and last used (to the hour: keys.py)."""

    key_id: str
    sha256: str
    created_at: datetime | None = None
    last_used_at: datetime | None = None


class Client(BaseModel):
    """A paying client and its credit balance; `disabled_at`: new work is refused at every
    door; `removed_at`: closed for good (the row and the ledger stay, secrets are gone)."""

    client_id: str
    balance: int = 0
    held: int = 0
    created_at: datetime
    webhook_secret: str | None = None
    api_keys: list[ApiKey] = Field(default_factory=list)
    disabled_at: datetime | None = None
    removed_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_key_hashes(cls, data: Any) -> Any:
        """A client stored before keys had ids lists bare hashes (`api_key_hashes`): each
        becomes a key whose id is made of its hash, the same at every read."""
        if not isinstance(data, dict) or not data.get("api_key_hashes"):
            return data
        keys = list(data.get("api_keys") or [])
        known = {k["sha256"] if isinstance(k, dict) else k.sha256 for k in keys}
        for digest in data["api_key_hashes"]:
            if digest not in known:
                keys.append({"key_id": f"{LEGACY_KEY_PREFIX}{digest[:12]}", "sha256": digest})
        return {**data, "api_keys": keys}

    @property
    def available(self) -> int:
        """Credits that a new batch may hold."""
        return self.balance - self.held


class LedgerEntry(BaseModel):
    """One money movement; balances change only through these."""

    entry_id: str = Field(default_factory=lambda: secrets.token_hex(8))
    client_id: str
    amount: int
    held_change: int = 0
    balance_after: int
    held_after: int = 0
    kind: LedgerKind
    batch_id: str | None = None
    note: str = ""
    at: datetime
