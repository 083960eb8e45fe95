"""The endpoint's host key, lock and status file, all under `<state>/sftp/`.

- `ssh_host_ed25519_key` (0600) and `ssh_host_ed25519_key.pub`: created on the first start;
  clients pin its fingerprint (printed at start, shown by `dropbox-eval status`). On
  PostgreSQL the private key is kept in the database, shared by every node
  (store/pg/sftpkeys.py), and this folder gets only the `.pub` file.
- `sftp.lock`: held while an endpoint runs on this state folder.
- `status.json`: address, pid, start time and host key fingerprint of the last start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from ..errors import ConfigError
from ..store.secrecy import private_folder
from ..store.sftpkeyfiles import HOST_KEY_NAME
from ..store.sftpkeys import SftpKeys, fingerprint_of
from ..store.statefolder import open_sftp_keys
from ..util.fileio import SHARED_MODE, write_atomically, write_json
from ..util.locks import held_elsewhere
from ..util.timestamps import rfc3339

if TYPE_CHECKING:  # asyncssh is imported only by what needs it: `status` stays light
    import asyncssh


def sftp_folder(state_dir: Path) -> Path:
    """`<state>/sftp`, created 0700 if missing (in a state folder created 0700 too)."""
    private_folder(state_dir)
    return private_folder(state_dir / "sftp")


def load_or_create_host_key(state_dir: Path, kept: SftpKeys) -> asyncssh.SSHKey:
    """The endpoint's ed25519 host key, generated and stored (`kept`: in the state folder,
    or the database all nodes share) on the first call anywhere; its public half is
    written to `<state>/sftp/ssh_host_ed25519_key.pub` (what `status` reads)."""
    import asyncssh

    def new_key() -> bytes:
        key = asyncssh.generate_private_key("ssh-ed25519", comment="dropbox-eval sftp")
        return bytes(key.export_private_key("openssh"))

    try:
        key = asyncssh.import_private_key(kept.host_key(new_key))
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise ConfigError(f"cannot read the SFTP host key ({exc})") from None
    public = bytes(key.export_public_key("openssh"))
    path = sftp_folder(state_dir) / f"{HOST_KEY_NAME}.pub"
    try:
        current = path.read_bytes()
    except FileNotFoundError:
        current = None
    if current != public:  # the public half: no secret, what `status` and clients read
        write_atomically(path, public, mode=SHARED_MODE)
    return key


def known_hosts_line(state_dir: Path, host: str, port: int, database_url: str | None = None) -> str:
    """The line a client puts in its `known_hosts` to pin the endpoint's host key (the key
    is created now if the endpoint never ran: it is the one the endpoint will load), as
    OpenSSH writes it: `[host]:port` unless the port is 22."""
    kept = open_sftp_keys(state_dir, database_url)
    try:
        key = load_or_create_host_key(state_dir, kept)
    finally:
        kept.close()
    public = key.export_public_key("openssh").decode("ascii").split()
    where = host if port == 22 else f"[{host}]:{port}"
    return f"{where} {public[0]} {public[1]}"


def host_key_fingerprint(state_dir: Path) -> str | None:
    """SHA256 fingerprint of the stored host key, or None before the first start."""
    path = state_dir / "sftp" / f"{HOST_KEY_NAME}.pub"
    try:
        line = path.read_text("ascii")
    except (OSError, ValueError):
        return None
    return fingerprint_of(line)  # what `ssh-keygen -lf` and OpenSSH clients print


def endpoint_lock(state_dir: Path) -> FileLock:
    """The lock a running endpoint holds."""
    return FileLock(str(sftp_folder(state_dir) / "sftp.lock"), mode=0o600)


def write_status(state_dir: Path, record: dict[str, Any]) -> None:
    """Record the running endpoint (address, pid, start, host key)."""
    write_json(sftp_folder(state_dir) / "status.json", record)


def sftp_status(state_dir: Path) -> dict[str, Any]:
    """What `dropbox-eval status` shows about the endpoint: running, address, host key."""
    folder = state_dir / "sftp"
    if not folder.is_dir():
        return {"running": False, "host_key": None}
    try:
        record: dict[str, Any] = json.loads((folder / "status.json").read_text("utf-8"))
    except (OSError, ValueError):
        record = {}
    if "started_at" in record:  # an older version wrote microseconds and +00:00
        record["started_at"] = rfc3339(record["started_at"])
    record["running"] = held_elsewhere(endpoint_lock(state_dir))
    record["host_key"] = host_key_fingerprint(state_dir)
    return record
