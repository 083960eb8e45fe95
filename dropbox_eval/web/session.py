"""Operator sessions: what the `/operator` login cookie holds instead of the key.

A login creates a random session token (`secrets.token_urlsafe`), kept server-side in this
process's memory together with its expiry, a CSRF token for the page's forms, and a digest
of the operator key it was opened with. The cookie carries only the token, so a leaked
cookie is never the key and stops working when the session expires (SESSION_SECONDS), when
the operator signs out, when the key changes, or when the process restarts. Only a SHA-256
of each token is kept, so the table itself holds nothing a browser could present.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 64  # a login past this drops the oldest session: memory stays bounded


def key_matches(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; no key configured means nobody gets in."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def operator_key_id(key: str | None) -> str | None:
    """Which operator key acted, for the audit log: `op_` and the start of its sha256 (a key
    changed is a new id; the key itself cannot be found from it)."""
    return f"op_{hashlib.sha256(key.encode()).hexdigest()[:8]}" if key else None


@dataclass(frozen=True)
class Session:
    """One signed-in browser: its forms' CSRF token, the key it signed in with, expiry, and
    the name the operator gave at sign-in (for the audit log; `operator` when none)."""

    csrf: str
    key_digest: bytes
    expires_at: float
    operator: str = "operator"

    def allows(self, csrf: str | None) -> bool:
        """Whether a form posted `csrf` for this session (constant time)."""
        return bool(csrf) and hmac.compare_digest(str(csrf).encode(), self.csrf.encode())


class OperatorSessions:
    """The live sessions of one web app (thread-safe; lost on restart by design)."""

    def __init__(
        self, lifetime: float = SESSION_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lifetime = lifetime
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[bytes, Session] = {}
        self._notes: dict[bytes, str] = {}  # a form's outcome, shown once by the next view

    def open(self, key: str, name: str = "") -> tuple[str, Session]:
        """A new session for someone who just gave the right `key` (and their `name`,
        optional): the cookie's token (not kept) and the session."""
        token = secrets.token_urlsafe(32)
        session = Session(
            csrf=secrets.token_urlsafe(32),
            key_digest=_digest(key),
            expires_at=self.clock() + self.lifetime,
            operator=operator_name(name),
        )
        with self._lock:
            self._drop_expired()
            while len(self._sessions) >= MAX_SESSIONS:
                oldest = min(self._sessions, key=lambda k: self._sessions[k].expires_at)
                del self._sessions[oldest]
            self._sessions[_digest(token)] = session
        return token, session

    def find(self, token: str | None, key: str | None) -> Session | None:
        """The session of a cookie's `token`, if it is live and was opened with the
        operator key as it is now; None otherwise."""
        if not token or not key:
            return None
        with self._lock:
            session = self._sessions.get(_digest(token))
            if session is None:
                return None
            if session.expires_at <= self.clock() or not hmac.compare_digest(
                session.key_digest, _digest(key)
            ):
                del self._sessions[_digest(token)]
                return None
            return session

    def close(self, token: str | None) -> None:
        """Sign out: the token stops working everywhere at once."""
        if token:
            with self._lock:
                self._sessions.pop(_digest(token), None)
                self._notes.pop(_digest(token), None)

    def post_note(self, token: str | None, note: str) -> None:
        """Keep a form's outcome for this session's next view (never taken from a URL, so
        a crafted link cannot put words on the page)."""
        if token:
            with self._lock:
                if _digest(token) in self._sessions:
                    self._notes[_digest(token)] = note

    def take_note(self, token: str | None) -> str:
        """The outcome kept for this session, once; "" when there is none."""
        if not token:
            return ""
        with self._lock:
            return self._notes.pop(_digest(token), "")

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _drop_expired(self) -> None:
        now = self.clock()
        for token_digest in [d for d, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[token_digest]
            self._notes.pop(token_digest, None)


def operator_name(name: str) -> str:
    """The name typed at sign-in, as the audit log keeps it: printable, at most 64
    characters, `operator` when none (it is the operator's word, not an identity)."""
    shown = "".join(c for c in name.strip() if c.isprintable())[:64]
    return shown or "operator"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()
