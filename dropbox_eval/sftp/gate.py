"""The door of the SFTP endpoint: one `Gate` per connection decides who logs in.

- public keys only; the SSH user name is the client id and the key must be one of that
  client's (keys.py); a reserved client id (names.py) never logs in;
- failed logins are counted per source address and user name (ratelimit.py): a client
  that keeps failing locks out only itself, an address spraying many user names is refused
  for all of them. A connection that starts to log in as a user and never succeeds is one
  failure for that user;
- a client at its session limit, or disabled or removed by the operator, is disconnected
  after its login with the reason (`client_disabled: ...`): that is a refusal, never a
  failed login, so retrying locks nobody out, and only the key's holder learns the reason.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import asyncssh

from ..util.logfilter import AUDIT
from ..util.names import reserved_reason
from .accounting import Session

if TYPE_CHECKING:
    from .keys import KeyStore
    from .ratelimit import FailureLimiter, SessionCounter


class Endpoint(Protocol):
    """What a gate needs of the endpoint it guards (server.py's Endpoint)."""

    keys: KeyStore
    limiter: FailureLimiter
    counter: SessionCounter

    def opened(self, conn: object, session: Session) -> bool:
        """Register an authenticated connection unless its client is at its limit."""
        ...

    def closed(self, conn: object, exc: Exception | None) -> None:
        """Account for a session that ended."""
        ...


log = logging.getLogger("dropbox_eval")


class Gate(asyncssh.SSHServer):
    """Per-connection authentication and limits."""

    def __init__(self, endpoint: Endpoint) -> None:
        """One gate per incoming connection."""
        self.endpoint = endpoint
        self.conn: asyncssh.SSHServerConnection | None = None
        self.peer = "?"
        self.username: str | None = None  # the user being tried, until a login fails
        self.fingerprint = ""
        self.refused = False  # by the failure limiter: nothing more is counted
        self.authenticated = False

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        """Note the source address."""
        self.conn = conn
        peer = conn.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else "?"

    def begin_auth(self, username: str) -> bool:
        """A login as `username` starts (again for each new name the client sends); the
        earliest point where a refused client is shown why."""
        if self.username is not None and self.username != username:
            self._count_failure()  # the connection gave up on the previous name
        self.username = username
        reserved = reserved_reason(username)
        if reserved is not None:  # KeyStore.find accepts no key for it
            log.warning(
                "sftp: login as %r from %s refused: %s", username, self.peer, reserved, extra=AUDIT
            )
        self._refuse_if_limited(username)
        return True  # authentication is always required

    def _refuse_if_limited(self, username: str) -> None:
        if self.refused:
            return
        why = self.endpoint.limiter.refusal(self.peer, username)
        if why is None:
            return
        self.refused = True
        limiter = self.endpoint.limiter
        log.warning(
            "sftp: refused %s as %r: %s (limits: %d per user, %d users, per %.0f s)",
            self.peer,
            username,
            why,
            limiter.max_failures,
            limiter.max_users,
            limiter.window,
            extra=AUDIT,
        )
        assert self.conn is not None
        self.conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE, why)

    def password_auth_supported(self) -> bool:
        """Never: keys only."""
        return False

    def kbdint_auth_supported(self) -> bool:
        """Never: keys only."""
        return False

    def public_key_auth_supported(self) -> bool:
        """Unless the limiter refused the connection."""
        return not self.refused

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """Whether `key` is one of the client `username`'s keys."""
        entry = self.endpoint.keys.find(username, key)
        if entry is None:
            log.info(
                "sftp: key %s from %s not accepted for user %r",
                key.get_fingerprint("sha256"),
                self.peer,
                username,
            )
            return False
        self.fingerprint = entry.fingerprint
        return True

    def auth_completed(self) -> None:
        """The login succeeded: open the session unless the client is at its limit."""
        assert self.conn is not None and self.username is not None
        client_id, self.username = self.username, None  # nothing left to count as failed
        refusal = self.endpoint.keys.refusal(client_id)
        if refusal is not None:
            log.warning(
                "sftp: login of %s from %s refused: %s", client_id, self.peer, refusal, extra=AUDIT
            )
            self.conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE, refusal)
            return
        self.endpoint.keys.note_use(client_id, self.fingerprint)
        session = Session(client_id, self.fingerprint, self.peer)
        if self.endpoint.opened(self.conn, session):
            self.authenticated = True
            return
        self.conn.disconnect(
            asyncssh.DISC_TOO_MANY_CONNECTIONS,
            f"too many sessions for {client_id} (limit {self.endpoint.counter.limit}, "
            "SAAS_EVAL_SFTP_MAX_SESSIONS): close one and try again",
        )

    def connection_lost(self, exc: Exception | None) -> None:
        """Account for the session, or count the login that never succeeded."""
        assert self.conn is not None
        if self.authenticated:
            self.endpoint.closed(self.conn, exc)
        else:
            self._count_failure()

    def _count_failure(self) -> None:
        if self.username is None or self.refused:
            return
        username, self.username = self.username, None
        limiter = self.endpoint.limiter
        count = limiter.failed(self.peer, username)
        log.warning(
            "sftp: failed login from %s as %r (%d of %d allowed per %.0f s)",
            self.peer,
            username,
            count,
            limiter.max_failures,
            limiter.window,
            extra=AUDIT,
        )
