"""The endpoint's host key, lock and status file, all under `<state>/sftp/`.

- `ssh_host_ed25519_key` (0600) and `ssh_host_ed25519_key.pub`: created on the first start;
  clients pin its fingerprint (printed at start, shown by `dropbox-eval status`).
- `sftp.lock`: held while an endpoint runs on this state folder.
- `status.json`: address, pid, start time and host key fingerprint of the last start.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from ..errors import ConfigError
from ..store.secrecy import private_folder
from ..util.fileio import write_json
from ..util.locks import held_elsewhere
from ..util.timestamps import rfc3339

if TYPE_CHECKING:  # asyncssh is imported only by what needs it: `status` stays light
    import asyncssh

HOST_KEY_NAME = "ssh_host_ed25519_key"


def sftp_folder(state_dir: Path) -> Path:
    """`<state>/sftp`, created 0700 if missing (in a state folder created 0700 too)."""
    private_folder(state_dir)
    return private_folder(state_dir / "sftp")


def load_or_create_host_key(state_dir: Path) -> asyncssh.SSHKey:
    """The endpoint's ed25519 host key, generated and stored 0600 on the first call."""
    import asyncssh

    path = sftp_folder(state_dir) / HOST_KEY_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_host_key(path)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="dropbox-eval sftp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.export_private_key("openssh"))
        handle.flush()
        os.fsync(handle.fileno())
    path.with_name(f"{HOST_KEY_NAME}.pub").write_bytes(key.export_public_key("openssh"))
    return key


def _read_host_key(path: Path) -> asyncssh.SSHKey:
    import asyncssh

    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & 0o077:
        raise ConfigError(f"{path} is readable by others (mode {mode:o}): chmod 600 it")
    try:
        return asyncssh.read_private_key(str(path))
    except (asyncssh.KeyImportError, OSError) as exc:
        raise ConfigError(f"{path}: cannot read the SFTP host key ({exc})") from None


def known_hosts_line(state_dir: Path, host: str, port: int) -> str:
    """The line a client puts in its `known_hosts` to pin the endpoint's host key (the key
    is created now if the endpoint never ran: it is the one the endpoint will load), as
    OpenSSH writes it: `[host]:port` unless the port is 22."""
    key = load_or_create_host_key(state_dir)
    public = key.export_public_key("openssh").decode("ascii").split()
    where = host if port == 22 else f"[{host}]:{port}"
    return f"{where} {public[0]} {public[1]}"


def host_key_fingerprint(state_dir: Path) -> str | None:
    """SHA256 fingerprint of the stored host key, or None before the first start."""
    path = state_dir / "sftp" / f"{HOST_KEY_NAME}.pub"
    try:
        blob = base64.b64decode(path.read_text("ascii").split()[1], validate=True)
    except (OSError, IndexError, ValueError, binascii.Error):
        return None
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")
    return f"SHA256:{digest}"  # what `ssh-keygen -lf` and OpenSSH clients print


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
