"""Client public keys for the SFTP endpoint: `state/sftp/keys/<client_id>.pub`.

One OpenSSH public key a line (`ssh-ed25519 AAAA... comment`), written atomically; the
endpoint reads the file at each login, so an added or removed key counts at once, without a
restart. asyncssh's key errors are translated here (the boundary) into ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import asyncssh
from filelock import FileLock

from ..errors import ConfigError, InvalidArgument, NotFoundError
from ..models import is_valid_client_id, is_valid_id
from ..util.fileio import write_atomically
from ..util.names import reserved_reason
from .status import sftp_folder


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

    def __init__(self, state_dir: Path) -> None:
        """Keys live in `state_dir/sftp/keys`."""
        self.state_dir = state_dir
        self.folder = state_dir / "sftp" / "keys"

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
        return next(k for k in present if k.fingerprint == wanted)

    def find(self, client_id: str, key: asyncssh.SSHKey) -> AuthorizedKey | None:
        """The stored entry matching `key` if the client may log in with it (never for a
        reserved client id, whatever key file it has)."""
        if not is_valid_client_id(client_id):
            return None
        fingerprint = key.get_fingerprint("sha256")
        return next((k for k in self.keys(client_id) if k.fingerprint == fingerprint), None)

    def _write(self, client_id: str, keys: list[AuthorizedKey]) -> None:
        write_atomically(self._path(client_id), "".join(f"{k.line}\n" for k in keys))
