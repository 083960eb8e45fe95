"""Client accounts, the funded check, and the ledger that moves money."""

from __future__ import annotations

from typing import Literal

from .errors import BatchRejected, DropboxEvalError, NotFoundError
from .models import Client, LedgerEntry, utcnow
from .store import Store

LedgerKind = Literal["fund", "charge", "refund"]


class Billing:
    """Credits per client; every balance change is a ledger entry posted under the store lock."""

    def __init__(self, store: Store, task_price: int) -> None:
        self.store = store
        self.task_price = task_price

    def add_client(self, client_id: str, credits: int = 0) -> Client:
        """Create a client, optionally funded; raises if it exists."""
        with self.store.locked():
            if self.store.get_client(client_id) is not None:
                raise DropboxEvalError(f"client {client_id!r} already exists")
            self.store.add_client(Client(client_id=client_id, created_at=utcnow()))
            if credits:
                self._post(client_id, credits, "fund", note="initial credits")
        return self.client(client_id)

    def fund(self, client_id: str, credits: int, note: str = "") -> Client:
        """Add credits (must be positive)."""
        if credits <= 0:
            raise DropboxEvalError("credits to add must be a positive whole number")
        with self.store.locked():
            self.client(client_id)
            self._post(client_id, credits, "fund", note=note)
        return self.client(client_id)

    def client(self, client_id: str) -> Client:
        """The client; NotFoundError when unknown."""
        found = self.store.get_client(client_id)
        if found is None:
            raise NotFoundError(f"no client {client_id!r}")
        return found

    def cost(self, task_count: int) -> int:
        """Price of a batch of `task_count` tasks."""
        return task_count * self.task_price

    def check_funded(self, client_id: str, task_count: int) -> int:
        """Return the batch cost or raise BatchRejected(unknown_client | unfunded)."""
        client = self.store.get_client(client_id)
        if client is None:
            raise BatchRejected(
                "unknown_client",
                f"client {client_id!r} has no account; ask the operator to create one",
                client_id=client_id,
            )
        cost = self.cost(task_count)
        if client.balance < cost:
            raise BatchRejected(
                "unfunded",
                f"batch costs {cost} credits ({task_count} tasks x {self.task_price}) but "
                f"the balance is {client.balance}; add credits and drop the file again",
                client_id=client_id, cost=cost, balance=client.balance,
            )
        return cost

    def charge_entry(self, client_id: str, amount: int, batch_id: str) -> LedgerEntry | None:
        """The ledger entry debiting a batch's cost (None when free); the caller holds the
        store lock, checked funding, and posts it together with the batch."""
        if not amount:
            return None
        return self._entry(client_id, -amount, "charge", batch_id=batch_id)

    def _post(self, client_id: str, amount: int, kind: LedgerKind, note: str = "") -> None:
        self.store.post_ledger(self._entry(client_id, amount, kind, note=note))

    def _entry(self, client_id: str, amount: int, kind: LedgerKind,
               batch_id: str | None = None, note: str = "") -> LedgerEntry:
        balance = self.client(client_id).balance + amount
        return LedgerEntry(client_id=client_id, amount=amount, balance_after=balance, kind=kind,
                           batch_id=batch_id, note=note, at=utcnow())
