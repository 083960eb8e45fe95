"""Client public keys for the SFTP endpoint: `state/sftp/keys/<client_id>.pub`.

One OpenSSH public key a line (`ssh-ed25519 AAAA... comment`), written atomically; the
endpoint reads the file at each login, so an added or removed key counts at once, without a
restart. A key's id is its SHA256 fingerprint; `<client_id>.json` beside the file says when
each key was added and last used (to the hour), and is absent for keys added before it
existed. A login is also refused once the client is disabled or removed (`refusal`, read
from the store at each login). asyncssh's key errors are translated here (the boundary)
into ConfigError.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncssh
from filelock import FileLock

from ..errors import ConfigError, DropboxEvalError, InvalidArgument, NotFoundError
from ..models import is_valid_client_id, is_valid_id
from ..store import Store
from ..store.statefolder import open_store
from ..util.fileio import write_atomically
from ..util.names import reserved_reason
from ..util.timestamps import now, parse, utcnow
from .status import sftp_folder

LAST_USE_STEP = timedelta(hours=1)  # as API keys (billing/apikeys.py)
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
    """Per-client public key files under `<state>/sftp/keys/`."""

    def __init__(self, state_dir: Path, database_url: str | None = None) -> None:
        """Keys live in `state_dir/sftp/keys`; the clients are read from the store, on
        PostgreSQL when `database_url` is set (the service's SAAS_EVAL_DATABASE_URL)."""
        self.state_dir = state_dir
        self.database_url = database_url
        self.folder = state_dir / "sftp" / "keys"
        self._store: Store | None = None

    def _path(self, client_id: str) -> Path:
        if not is_valid_id(client_id):
            raise NotFoundError(f"no client {client_id!r}")
        return self.folder / f"{client_id}.pub"

    def _lock(self) -> FileLock:
        sftp_folder(self.state_dir)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        return FileLock(str(self.folder / ".keys.lock"))

    def keys(self, client_id: str) -> list[AuthorizedKey]:
        """The client's keys (none if it has no key file)."""
        try:
            text = self._path(client_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        keys: list[AuthorizedKey] = []
        for line in text.splitlines():
            try:
                keys.extend(parse_public_keys(line))
            except ConfigError:
                continue  # a hand-edited bad line never locks the other keys out
        return keys

    def add(self, client_id: str, text: str) -> list[AuthorizedKey]:
        """Add every key in `text`; returns those that were new."""
        reserved = reserved_reason(client_id)
        if reserved is not None:  # a client stored before its id was reserved
            raise InvalidArgument(f"{reserved}; it cannot log in over SFTP")
        wanted = parse_public_keys(text)
        with self._lock():
            present = self.keys(client_id)
            known = {k.fingerprint for k in present}
            added = []
            for key in wanted:
                if key.fingerprint not in known:
                    added.append(key)
                    known.add(key.fingerprint)
            if added:
                self._write(client_id, present + added)
                times = self._times(client_id)
                for key in added:
                    times[key.fingerprint] = {"added_at": now()}
                self._write_times(client_id, times)
        return added

    def remove(self, client_id: str, fingerprint: str) -> AuthorizedKey:
        """Remove the key with that fingerprint (`SHA256:...`, the prefix may be left out)."""
        wanted = fingerprint if fingerprint.startswith("SHA256:") else f"SHA256:{fingerprint}"
        with self._lock():
            present = self.keys(client_id)
            kept = [k for k in present if k.fingerprint != wanted]
            if len(kept) == len(present):
                raise NotFoundError(f"client {client_id} has no key {wanted}")
            self._write(client_id, kept)
            times = self._times(client_id)
            if times.pop(wanted, None) is not None:
                self._write_times(client_id, times)
        return next(k for k in present if k.fingerprint == wanted)

    def remove_all(self, client_id: str) -> int:
        """Remove every key of the client (a removed client); returns how many there were."""
        with self._lock():
            count = len(self.keys(client_id))
            for path in (self._path(client_id), self._times_path(client_id)):
                path.unlink(missing_ok=True)
        return count

    def listed(self, client_id: str) -> list[dict[str, Any]]:
        """The client's keys as listed: id (the fingerprint), algorithm, comment, when it
        was added and last used (None: not known, a key older than these records)."""
        times = self._times(client_id)
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
            with self._lock():
                times = self._times(client_id)
                used = times.get(fingerprint, {}).get("last_used_at")
                if used is not None and utcnow() - parse(used) < LAST_USE_STEP:
                    return
                times.setdefault(fingerprint, {})["last_used_at"] = now()
                self._write_times(client_id, times)
        except OSError as exc:
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
            return "the service cannot read your account now: try again later"
        if client is None or client.removed_at is not None:
            return f"no client {client_id!r}"
        if client.disabled_at is not None:
            return f"client_disabled: client {client_id!r} is disabled; ask the operator"
        return None

    def close(self) -> None:
        """Close the store `refusal` reads (a database's connections)."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def session_refusal(self, client_id: str, fingerprint: str) -> str | None:
        """Why a session opened with this key may no longer start an upload (the key was
        revoked, or the client disabled or removed since the login); None when it may."""
        if all(k.fingerprint != fingerprint for k in self.keys(client_id)):
            return f"key {fingerprint} was revoked: log in again with a listed key"
        return self.refusal(client_id)

    def _times_path(self, client_id: str) -> Path:
        return self._path(client_id).with_suffix(".json")

    def _times(self, client_id: str) -> dict[str, dict[str, str]]:
        with contextlib.suppress(FileNotFoundError, ValueError):
            data = json.loads(self._times_path(client_id).read_text(encoding="utf-8"))
            if isinstance(data, dict):
                return data
        return {}

    def _write_times(self, client_id: str, times: dict[str, dict[str, str]]) -> None:
        write_atomically(self._times_path(client_id), json.dumps(times, sort_keys=True))

    def find(self, client_id: str, key: asyncssh.SSHKey) -> AuthorizedKey | None:
        """The stored entry matching `key` if the client may log in with it (never for a
        reserved client id, whatever key file it has)."""
        if not is_valid_client_id(client_id):
            return None
        fingerprint = key.get_fingerprint("sha256")
        return next((k for k in self.keys(client_id) if k.fingerprint == fingerprint), None)

    def _write(self, client_id: str, keys: list[AuthorizedKey]) -> None:
        write_atomically(self._path(client_id), "".join(f"{k.line}\n" for k in keys))
