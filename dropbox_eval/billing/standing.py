"""A client's standing: active, disabled or removed.

- **Disabled** (`clients disable`): every door refuses new work with `client_disabled`: a
  drop is rejected (an error file), the API answers 403, an SFTP login is refused. Batches
  already taken run to their end and their reports are delivered; `clients enable` undoes
  it. Its keys are kept.
- **Removed** (`clients remove`): the account is closed for good. Allowed only once the
  account is *settled*: no batch of it is live (running, or ended with its report not yet
  delivered), nothing is held, and its balance is zero. Credits left must be written off
  explicitly (`--write-off`: one `write_off` ledger entry taking the balance to zero, so
  the ledger still sums to every balance it shows) rather than vanish with the account.
  The client's row stays, disabled, with its ledger and archived batches, for the books;
  its webhook secret and API keys are dropped, and its id is never given to another client
  (a new account under that id would inherit a history that is not its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import NotFoundError, NotSettled
from ..models import Client, LedgerEntry, utcnow
from ..util.timestamps import rfc3339

if TYPE_CHECKING:
    from ..store import Store


def existing_client(store: Store, client_id: str) -> Client:
    """The client, unless unknown or removed (NotFoundError saying which)."""
    found = store.get_client(client_id)
    if found is None:
        raise NotFoundError(f"no client {client_id!r}")
    if found.removed_at is not None:
        raise NotFoundError(
            f"client {client_id!r} was removed on {rfc3339(found.removed_at)}; its ledger "
            f"is kept (`dropbox-eval clients show {client_id}`)"
        )
    return found


class Standing:
    """The standing part of Billing (a mixin over Billing's `store`)."""

    store: Store

    def disable(self, client_id: str) -> Client:
        """Refuse the client's new work at every door (again: no change, the first time
        is kept); its running batches go on."""
        with self.store.transaction() as tx:
            client = existing_client(self.store, client_id)
            if client.disabled_at is None:
                tx.update_client(client_id, disabled_at=utcnow().isoformat())
        return existing_client(self.store, client_id)

    def enable(self, client_id: str) -> Client:
        """Take the client's new work again."""
        with self.store.transaction() as tx:
            existing_client(self.store, client_id)
            tx.update_client(client_id, disabled_at=None)
        return existing_client(self.store, client_id)

    def remove(self, client_id: str, *, write_off: bool = False) -> Client:
        """Close a settled account (module docstring); `write_off` posts the credits left
        as a `write_off` entry first. Raises NotSettled, changing nothing, otherwise."""
        with self.store.transaction() as tx:
            client = existing_client(self.store, client_id)
            live = self.store.list_batches(live_only=True, client_id=client_id)
            if live:
                raise NotSettled(
                    f"client {client_id!r} has {len(live)} batch(es) running or with a report "
                    f"not yet delivered ({', '.join(b.batch_id for b in live[:5])}): disable "
                    "it, let them end and deliver, then remove it",
                    batches=[b.batch_id for b in live],
                )
            if client.held or (client.balance and not write_off):
                raise NotSettled(
                    f"client {client_id!r} has a balance of {client.balance} credits "
                    f"({client.held} held): remove it with --write-off to post the balance "
                    "as a write_off ledger entry (after refunding it elsewhere, if you do)",
                    balance=client.balance,
                    held=client.held,
                )
            if client.balance:
                tx.post_ledger(_write_off(client))
            moment = utcnow().isoformat()
            tx.update_client(
                client_id,
                removed_at=moment,
                disabled_at=client.disabled_at.isoformat() if client.disabled_at else moment,
                webhook_secret=None,
                api_keys=[],
                api_key_hashes=[],
            )
        removed = self.store.get_client(client_id)
        assert removed is not None  # the row stays
        return removed


def _write_off(client: Client) -> LedgerEntry:
    return LedgerEntry(
        client_id=client.client_id,
        kind="write_off",
        amount=-client.balance,
        balance_after=0,
        held_after=0,
        note="balance written off at removal",
        at=utcnow(),
    )
