"""A client's API keys: issued with an id, listed without the key, revoked at once.

A key is shown once when issued (`dek_<client>_<random>`); the store keeps its sha256, its
id (`ak_` + 12 random hex digits), when it was issued and when it was last used. Every
request looks its key up in the store as it is now, so a revoked key answers 401 on the
next request, in every process, without a restart. The last use is written at most once an
hour per key (LAST_USE_STEP): a request costs no write, and the time shown is never more
than an hour early. Keys issued before keys had ids get an id made of their hash
(models.Client), the same at every read, and can be listed and revoked like the others.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import ClientDisabled, InvalidArgument, NotFoundError, StoreError
from ..models import ApiKey, Client, utcnow
from ..util.names import reserved_reason
from .standing import existing_client

if TYPE_CHECKING:
    from ..store import Store

LAST_USE_STEP = timedelta(hours=1)
log = logging.getLogger("dropbox_eval")


def hash_api_key(key: str) -> str:
    """Keys are stored only as their sha256."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedKey:
    """A key just issued: its id (kept) and the key itself (shown once, never kept)."""

    key_id: str
    key: str


def keys_fields(keys: list[ApiKey]) -> dict[str, Any]:
    """The client fields that store `keys` (and empty the list of bare hashes of old
    states, so that a revoked old key does not come back from it)."""
    return {"api_keys": [k.model_dump(mode="json") for k in keys], "api_key_hashes": []}


class ApiKeys:
    """The API key part of Billing (a mixin over Billing's `store`)."""

    store: Store

    def issue_api_key(self, client_id: str) -> IssuedKey:
        """Issue a new API key for the client (its other keys stay valid)."""
        reserved = reserved_reason(client_id)
        if reserved is not None:  # a client stored before its id was reserved
            raise InvalidArgument(f"{reserved}; it gets no API key (see `dropbox-eval status`)")
        key = f"dek_{client_id}_{secrets.token_urlsafe(24)}"
        entry = ApiKey(
            key_id=f"ak_{secrets.token_hex(6)}", sha256=hash_api_key(key), created_at=utcnow()
        )
        with self.store.transaction() as tx:
            client = existing_client(self.store, client_id)
            tx.update_client(client_id, **keys_fields([*client.api_keys, entry]))
        return IssuedKey(entry.key_id, key)

    def new_api_key(self, client_id: str) -> str:
        """Issue an API key for the client and return the key (shown once)."""
        return self.issue_api_key(client_id).key

    def api_keys(self, client_id: str) -> list[ApiKey]:
        """The client's keys: ids, issue and last-use times (never a key)."""
        return existing_client(self.store, client_id).api_keys

    def revoke_api_key(self, client_id: str, key_id: str) -> ApiKey:
        """Forget the key `key_id` of the client: it answers 401 from the next request."""
        with self.store.transaction() as tx:
            client = existing_client(self.store, client_id)
            found = next((k for k in client.api_keys if k.key_id == key_id), None)
            if found is None:
                raise NotFoundError(
                    f"client {client_id!r} has no API key {key_id!r} "
                    f"(`dropbox-eval clients keys {client_id}` lists them)"
                )
            kept = [k for k in client.api_keys if k.key_id != key_id]
            tx.update_client(client_id, **keys_fields(kept))
        return found

    def client_for_key(self, key: str) -> Client | None:
        """The client owning an API key (None: no such key, or revoked); a disabled client's
        key raises ClientDisabled (403 `client_disabled`, not 401: the key is right)."""
        wanted = hash_api_key(key)
        for client in self.store.list_clients():
            for entry in client.api_keys:
                if hmac.compare_digest(entry.sha256, wanted):
                    if client.disabled_at is not None:
                        raise ClientDisabled(client.client_id)
                    self._note_use(client.client_id, entry)
                    return client
        return None

    def _note_use(self, client_id: str, entry: ApiKey) -> None:
        """Write the key's last use when the stored one is older than LAST_USE_STEP; a
        state that takes no write now (a full disk) does not refuse the request."""
        moment = utcnow()
        if entry.last_used_at is not None and moment - entry.last_used_at < LAST_USE_STEP:
            return
        try:
            with self.store.transaction() as tx:
                client = self.store.get_client(client_id)  # as it is now: revoked stays so
                if client is None or all(k.key_id != entry.key_id for k in client.api_keys):
                    return
                used = [
                    k.model_copy(update={"last_used_at": moment}) if k.key_id == entry.key_id else k
                    for k in client.api_keys
                ]
                tx.update_client(client_id, **keys_fields(used))
        except (StoreError, OSError) as exc:
            log.warning("API key %s: its last use was not recorded: %s", entry.key_id, exc)
