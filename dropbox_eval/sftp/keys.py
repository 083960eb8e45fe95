"""Client public keys for the SFTP endpoint: which key lets which client in.

Keys are kept where the store is (store/sftpkeys.py): files under the state folder
(`state/sftp/keys/<client_id>.pub`, one OpenSSH line a key), or the database that nodes
share. The endpoint reads them at each login and each upload's start, so an added or
removed key counts at once, on every node, without a restart. A key's id is its SHA256
fingerprint; when each key was added and last used (to the hour) is kept beside it. A
login is also refused once the client is disabled or removed (`refusal`, read from the
store at each login). asyncssh's key errors are translated here (the boundary) into
ConfigError.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncssh

from ..errors import ConfigError, DropboxEvalError, InvalidArgument, NotFoundError
from ..models import is_valid_client_id, is_valid_id
from ..store import Store
from ..store.sftpkeys import SftpKeys
from ..store.statefolder import open_sftp_keys, open_store
from ..util.names import reserved_reason

LAST_USE_STEP = timedelta(hours=1)  # as API keys (billing/apikeys.py)
PARSED_LINES = 10_000  # parsed key lines remembered (a line is ~100 bytes)
UNREADABLE = "the service cannot read your account now: try again later"
log = logging.getLogger("dropbox_eval")


@dataclass(frozen=True)
class AuthorizedKey:
    """One client key: its SHA256 fingerprint, algorithm, comment and the stored line."""

    fingerprint: str
    algorithm: str
    comment: str
    line: str


def parse_public_keys(text: str) -> list[AuthorizedKey]:
    """Every public key in `text` (blank lines and `#` comments skipped); errors name the line."""
    keys: list[AuthorizedKey] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "PRIVATE KEY" in line:
            raise ConfigError("that is a private key: give the public key (the .pub file)")
        try:
            key = asyncssh.import_public_key(line)
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise ConfigError(f"line {number}: not an OpenSSH public key ({exc})") from None
        keys.append(_describe(key))
    if not keys:
        raise ConfigError("no public key found (expected a line like 'ssh-ed25519 AAAA...')")
    return keys


def _describe(key: asyncssh.SSHKey) -> AuthorizedKey:
    comment = key.get_comment() or ""
    line = key.export_public_key("openssh").decode("ascii").strip()
    return AuthorizedKey(key.get_fingerprint("sha256"), key.get_algorithm(), comment, line)


class KeyStore:
    """The clients' SFTP keys, parsed and checked, over where they are kept."""

    def __init__(self, state_dir: Path, database_url: str | None = None) -> None:
        """Keys and clients are read where the store is: the database when `database_url`
        is set (the service's SAAS_EVAL_DATABASE_URL), else the state folder."""
        self.state_dir = state_dir
        self.database_url = database_url
        self.kept: SftpKeys = open_sftp_keys(state_dir, database_url)
        self._store: Store | None = None
        self._parsed: dict[str, tuple[AuthorizedKey, ...]] = {}

    def __enter__(self) -> KeyStore:
        """The key store, closed as the block ends."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close what it holds open."""
        self.close()

    def keys(self, client_id: str) -> list[AuthorizedKey]:
        """The client's keys (none if it has none), read again at each call; a line is
        parsed once (each upload's start asks, and parsing costs more than reading)."""
        keys: list[AuthorizedKey] = []
        for line in self.kept.lines(client_id):
            parsed = self._parsed.get(line)
            if parsed is None:
                try:
                    parsed = tuple(parse_public_keys(line))
                except ConfigError:
                    parsed = ()  # a hand-edited bad line never locks the other keys out
                if len(self._parsed) >= PARSED_LINES:
                    self._parsed.clear()
                self._parsed[line] = parsed
            keys.extend(parsed)
        return keys

    def add(self, client_id: str, text: str) -> list[AuthorizedKey]:
        """Add every key in `text`; returns those that were new."""
        reserved = reserved_reason(client_id)
        if reserved is not None:  # a client stored before its id was reserved
            raise InvalidArgument(f"{reserved}; it cannot log in over SFTP")
        if not is_valid_id(client_id):
            raise NotFoundError(f"no client {client_id!r}")
        wanted = parse_public_keys(text)
        added = set(self.kept.add(client_id, [(k.fingerprint, k.line) for k in wanted]))
        new = [k for k in wanted if k.fingerprint in added]
        return list({k.fingerprint: k for k in new}.values())

    def remove(self, client_id: str, fingerprint: str) -> AuthorizedKey:
        """Remove the key with that fingerprint (`SHA256:...`, the prefix may be left out)."""
        wanted = fingerprint if fingerprint.startswith("SHA256:") else f"SHA256:{fingerprint}"
        present = next((k for k in self.keys(client_id) if k.fingerprint == wanted), None)
        if present is None or not self.kept.remove(client_id, wanted):
            raise NotFoundError(f"client {client_id} has no key {wanted}")
        return present

    def remove_all(self, client_id: str) -> int:
        """Remove every key of the client (a removed client); returns how many there were."""
        return self.kept.remove_all(client_id)

    def listed(self, client_id: str) -> list[dict[str, Any]]:
        """The client's keys as listed: id (the fingerprint), algorithm, comment, when it
        was added and last used (None: not known, a key older than these records)."""
        times = self.kept.times(client_id)
        return [
            {
                "key_id": key.fingerprint,
                "kind": "sftp",
                "algorithm": key.algorithm,
                "comment": key.comment,
                "created_at": times.get(key.fingerprint, {}).get("added_at"),
                "last_used_at": times.get(key.fingerprint, {}).get("last_used_at"),
            }
            for key in self.keys(client_id)
        ]

    def note_use(self, client_id: str, fingerprint: str) -> None:
        """A login with the key: its last use is written when older than LAST_USE_STEP
        (a write that fails is logged; the login goes on)."""
        try:
            self.kept.note_use(client_id, fingerprint, LAST_USE_STEP)
        except (OSError, DropboxEvalError) as exc:
            log.warning("sftp: last use of key %s not recorded: %s", fingerprint, exc)

    def refusal(self, client_id: str) -> str | None:
        """Why the client may not log in although its key is right (disabled, removed, or
        its account unreadable now); None when it may."""
        try:
            if self._store is None:
                self._store = open_store(
                    self.state_dir, read_only=True, database_url=self.database_url
                )
            client = self._store.get_client(client_id)
        except DropboxEvalError as exc:
            log.warning("sftp: cannot read the client %s: %s", client_id, exc)
            return UNREADABLE
        if client is None or client.removed_at is not None:
            return f"no client {client_id!r}"
        if client.disabled_at is not None:
            return f"client_disabled: client {client_id!r} is disabled; ask the operator"
        return None

    def close(self) -> None:
        """Close the store `refusal` reads and where the keys are kept (a database's
        connections)."""
        if self._store is not None:
            self._store.close()
            self._store = None
        self.kept.close()

    def session_refusal(self, client_id: str, fingerprint: str) -> str | None:
        """Why a session opened with this key may no longer start an upload (the key was
        revoked, or the client disabled or removed since the login); None when it may."""
        try:
            revoked = all(k.fingerprint != fingerprint for k in self.keys(client_id))
        except DropboxEvalError as exc:
            log.warning("sftp: cannot read the keys of %s: %s", client_id, exc)
            return UNREADABLE
        if revoked:
            return f"key {fingerprint} was revoked: log in again with a listed key"
        return self.refusal(client_id)

    def find(self, client_id: str, key: asyncssh.SSHKey) -> AuthorizedKey | None:
        """The stored entry matching `key` if the client may log in with it (never for a
        reserved client id, whatever keys are stored for it; none while they cannot be
        read)."""
        if not is_valid_client_id(client_id):
            return None
        fingerprint = key.get_fingerprint("sha256")
        try:
            keys = self.keys(client_id)
        except DropboxEvalError as exc:
            log.warning("sftp: cannot read the keys of %s: %s", client_id, exc)
            return None
        return next((k for k in keys if k.fingerprint == fingerprint), None)
