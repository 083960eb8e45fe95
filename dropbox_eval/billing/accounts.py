"""Client accounts, holds and the final charge, secrets and API keys; every movement a
ledger entry.

A client's `balance` is its credits; `held` is the part reserved by running batches.
Accepting a batch holds tasks x price; when the batch ends the client is charged only for
tasks the lane finished and the hold is released. A batch is accepted only when the
available credits (balance - held) cover it, so concurrent batches never overdraw.
"""

from __future__ import annotations

import base64
import secrets

from ..errors import BatchRejected, ClientDisabled, DropboxEvalError, InvalidArgument
from ..models import ID_PATTERN, Client, LedgerEntry, LedgerKind, is_valid_id, utcnow
from ..store import Store
from ..util import crashpoints
from ..util.names import reserved_reason
from ..util.timestamps import rfc3339
from .apikeys import ApiKeys, hash_api_key
from .standing import Standing, existing_client

__all__ = ["Billing", "hash_api_key", "new_webhook_secret"]


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Billing(ApiKeys, Standing):
    """Credits per client, its API keys (apikeys.py) and standing (standing.py); every
    change is posted under the store lock."""

    def __init__(self, store: Store, task_price: int) -> None:
        self.store = store
        self.task_price = task_price

    # -- accounts -----------------------------------------------------------------------

    def add_client(self, client_id: str, credits: int = 0) -> Client:
        """Create a client (with a webhook secret), optionally funded; raises if it exists."""
        if not is_valid_id(client_id):
            raise InvalidArgument(
                f"client id {client_id!r} must match {ID_PATTERN} (it names "
                "the client's inbox folder)"
            )
        reserved = reserved_reason(client_id)
        if reserved is not None:
            raise InvalidArgument(f"{reserved}; choose another id")
        with self.store.transaction() as tx:
            existing = self.store.get_client(client_id)
            if existing is not None and existing.removed_at is not None:
                raise DropboxEvalError(
                    f"client {client_id!r} was removed on {rfc3339(existing.removed_at)}; "
                    "its id stays with its ledger: choose another id"
                )
            if existing is not None:
                raise DropboxEvalError(
                    f"client {client_id!r} already exists: use "
                    f"`dropbox-eval clients fund {client_id} N` to add credits"
                )
            tx.add_client(
                Client(
                    client_id=client_id, created_at=utcnow(), webhook_secret=new_webhook_secret()
                )
            )
            if credits:
                tx.post_ledger(self._entry(client_id, "fund", credits, 0, note="initial credits"))
        return self.client(client_id)

    def fund(self, client_id: str, credits: int, note: str = "") -> Client:
        """Add credits (must be positive)."""
        if credits <= 0:
            raise InvalidArgument("credits to add must be a positive whole number")
        with crashpoints.operation("fund"), self.store.transaction() as tx:  # one index write
            self.client(client_id)
            tx.post_ledger(self._entry(client_id, "fund", credits, 0, note=note))
        return self.client(client_id)

    def client(self, client_id: str) -> Client:
        """The client; NotFoundError when unknown or removed."""
        return existing_client(self.store, client_id)

    def rotate_secret(self, client_id: str) -> str:
        """Replace the client's webhook secret; returns the new one."""
        secret = new_webhook_secret()
        with crashpoints.operation("rotate-secret"), self.store.transaction() as tx:
            self.client(client_id)  # one index write
            tx.update_client(client_id, webhook_secret=secret)
        return secret

    # -- batches ------------------------------------------------------------------------

    def cost(self, task_count: int) -> int:
        """Price of a batch of `task_count` tasks."""
        return task_count * self.task_price

    def check_funded(self, client_id: str, task_count: int) -> int:
        """Return the batch cost or raise BatchRejected(unknown_client | client_disabled |
        unfunded)."""
        client = self.store.get_client(client_id)
        if client is None or client.removed_at is not None:
            raise BatchRejected(
                "unknown_client",
                f"client {client_id!r} has no account; ask the operator to create one",
                client_id=client_id,
            )
        if client.disabled_at is not None:
            raise ClientDisabled(client_id)
        cost = self.cost(task_count)
        if client.available < cost:
            raise BatchRejected(
                "unfunded",
                f"batch costs {cost} credits ({task_count} tasks x {self.task_price}) but "
                f"{client.available} are available ({client.balance} balance, {client.held} "
                "held by running batches); add credits and drop the file again",
                client_id=client_id,
                cost=cost,
                balance=client.balance,
                available=client.available,
            )
        return cost

    def hold_entry(self, client_id: str, amount: int, batch_id: str) -> LedgerEntry | None:
        """The entry reserving a batch's cost (None when free); posted with the batch."""
        if not amount:
            return None
        return self._entry(client_id, "hold", 0, amount, batch_id=batch_id)

    def final_charge(
        self, client_id: str, batch_id: str, hold: int, charged: int
    ) -> list[LedgerEntry]:
        """Charge for finished tasks, release the whole hold."""
        steps: tuple[tuple[LedgerKind, int, int], ...] = (
            ("charge", -charged, 0),
            ("release", 0, -hold),
        )
        return [
            self._entry(client_id, kind, amount, held_change, batch_id=batch_id)
            for kind, amount, held_change in steps
            if amount or held_change
        ]

    @staticmethod
    def _entry(
        client_id: str,
        kind: LedgerKind,
        amount: int,
        held_change: int,
        batch_id: str | None = None,
        note: str = "",
    ) -> LedgerEntry:
        """A movement; the store fills in the balance and held amount after it, from the
        client as it is when the entry is posted under the lock."""
        return LedgerEntry(
            client_id=client_id,
            kind=kind,
            amount=amount,
            held_change=held_change,
            balance_after=0,
            held_after=0,
            batch_id=batch_id,
            note=note,
            at=utcnow(),
        )
