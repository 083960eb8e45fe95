"""Who calls: who may list batches (a client's API key: its own batches; the operator's key,
`SAAS_EVAL_OPERATOR_KEY`: everyone's, or one client's with `?client=`), and who a client's
delete is recorded as in the audit log.

A wrong key on the list route is counted by the sign-in throttle the pause routes share
(server.py puts it in the app's state), so the operator's key is guessed here no faster
than on the page's sign-in form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..errors import NotFoundError
from ..models import Client, is_valid_id
from .session import key_matches
from .throttle import LoginThrottle

if TYPE_CHECKING:
    from ..config import Settings
    from ..ops.retention import Audit
    from ..store import Store
    from ..views import Views

bearer = HTTPBearer(auto_error=False)
ClientOf = Callable[[HTTPAuthorizationCredentials | None], Client]
Lister = Callable[[Request, HTTPAuthorizationCredentials | None], Client | None]


def listing_caller(client_of: ClientOf, settings: Settings) -> Lister:
    """The dependency naming who lists: a client (its API key, as `client_of` finds it) or
    None for the operator."""

    def lister(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Client | None:
        throttle: LoginThrottle | None = getattr(request.app.state, "login_throttle", None)
        source = request.client.host if request.client else "-"
        given = credentials.credentials if credentials else None
        if settings.operator_key and throttle is not None:
            wait = throttle.retry_after(source)
            if wait:
                raise HTTPException(
                    429,
                    f"too many wrong keys from your address: try again in {wait} s",
                    headers={"Retry-After": str(wait)},
                )
        if key_matches(given, settings.operator_key):
            return None
        try:
            return client_of(credentials)
        except HTTPException as exc:
            if exc.status_code == 401 and settings.operator_key and throttle is not None:
                throttle.failed(source)
            raise

    return lister


def client_audit(store: Store) -> Audit:
    """A client's own delete (`DELETE /api/eval/batches/{id}`) in the audit log, under its
    client id."""

    def record(action: str, target: str, result: str, detail: dict[str, Any]) -> None:
        actor = f"client:{detail.get('client_id', '-')}"
        store.record_action(action, target, actor=actor, via="api", result=result, **detail)

    return record


def listing_scope(lister: Client | None, client: str | None) -> str | None:
    """The client whose batches are listed (None: everyone's, for the operator). A client's
    key lists its own: naming another client is refused (403)."""
    if lister is None:
        return client
    if client not in (None, lister.client_id):
        raise HTTPException(403, "only the operator's key lists another client's batches")
    return lister.client_id


def check_cursor(views: Views, after: str | None, scope: str | None) -> None:
    """Refuse (422) a cursor `after` that names no batch of the list: one the lister cannot
    see (another client's: its existence is not told), or one deleted since the cursor was
    handed out. Read on, it would match no row and end the list as if it had no more."""
    if after is None:
        return
    if is_valid_id(after):
        try:
            views.batch_summary(after, client_id=scope)
            return
        except NotFoundError:
            if views.tombstone(after, client_id=scope) is not None:
                raise HTTPException(
                    422,
                    f"the cursor's batch {after!r} was deleted: list again from the first "
                    "page (deleted batches are no longer in it)",
                ) from None
    raise HTTPException(422, f"`after`: no batch {after!r} in this list")
