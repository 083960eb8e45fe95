"""Where the SFTP endpoint's keys are kept: its host key and each client's public keys,
with when each key was added and last used.

One machine (TinyDB) keeps them in files under the state folder (sftpkeyfiles.py); nodes
sharing a PostgreSQL database keep them in the database (pg/sftpkeys.py), so that every
node's endpoint shows the same host key and takes the same client keys, and a key added or
revoked on one node counts on every other at its next login. `statefolder.open_sftp_keys`
chooses, where the store's engine is chosen. The host private key is a secret at rest,
kept as the clients' webhook secrets are: a 0600 file in the 0700 state folder, or a row
only its own module reads.

The SSH side (parsing, fingerprints of what a client sends, generating the host key) is
the endpoint's (sftp/keys.py, sftp/status.py): what is stored here is text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

KeyTimes = dict[str, dict[str, str]]
"""fingerprint -> {"added_at": ..., "last_used_at": ...} (RFC 3339, `Z`; either may be
missing: not known, or never used)."""


class SftpKeys(Protocol):
    """The endpoint's host key and the clients' public keys (one OpenSSH line each,
    `ssh-ed25519 AAAA... comment`, named by its `SHA256:...` fingerprint)."""

    def host_key(self, new_key: Callable[[], bytes]) -> bytes:
        """The host private key (OpenSSH format). The first call anywhere stores
        `new_key()`; a call racing it gets the key that was stored, never its own."""
        ...

    def lines(self, client_id: str) -> list[str]:
        """The client's public key lines, in the order they were added."""
        ...

    def times(self, client_id: str) -> KeyTimes:
        """When each of the client's keys was added and last used."""
        ...

    def add(self, client_id: str, keys: Sequence[tuple[str, str]]) -> list[str]:
        """Add each `(fingerprint, line)` the client does not have yet (added now);
        returns the fingerprints added."""
        ...

    def remove(self, client_id: str, fingerprint: str) -> bool:
        """Remove the key; False when the client has no such key."""
        ...

    def remove_all(self, client_id: str) -> int:
        """Remove every key of the client; returns how many there were."""
        ...

    def note_use(self, client_id: str, fingerprint: str, step: timedelta) -> None:
        """A login with the key: its last use is set to now when older than `step`
        (or never written), so that a busy key is written once per step."""
        ...

    def close(self) -> None:
        """Release what the keys hold open (a database's connections)."""
        ...


def fingerprint_of(line: str) -> str | None:
    """The `SHA256:...` fingerprint of a public key line (as OpenSSH prints it), None
    when the line holds no key blob."""
    try:
        blob = base64.b64decode(line.split()[1], validate=True)
    except (IndexError, ValueError, binascii.Error):
        return None
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")
    return f"SHA256:{digest}"
