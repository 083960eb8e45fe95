"""The SFTP keys in files under the state folder (one machine, the TinyDB engine).

- `sftp/ssh_host_ed25519_key`: the host private key, created 0600 on the first call (an
  exclusive create: two processes starting at once write it once); one readable by others
  is refused.
- `sftp/keys/<client_id>.pub`: one OpenSSH public key a line, written atomically, read at
  each login, so an added or removed key counts at once, without a restart;
  `<client_id>.json` beside it says when each key was added and last used (absent for
  keys added before it existed). Changes are made under `sftp/keys/.keys.lock`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from filelock import FileLock

from ..errors import ConfigError, NotFoundError
from ..models import is_valid_id
from ..util.fileio import write_atomically
from ..util.timestamps import now, parse, utcnow
from .secrecy import private_folder
from .sftpkeys import KeyTimes, fingerprint_of

HOST_KEY_NAME = "ssh_host_ed25519_key"


class SftpKeyFiles:
    """The SftpKeys contract (sftpkeys.py) on the files of `state_dir/sftp/`."""

    def __init__(self, state_dir: Path) -> None:
        """Nothing is created before the first write."""
        self.state_dir = state_dir
        self.folder = state_dir / "sftp" / "keys"

    def _sftp_folder(self) -> Path:
        private_folder(self.state_dir)
        return private_folder(self.state_dir / "sftp")

    def host_key(self, new_key: Callable[[], bytes]) -> bytes:
        """The host private key, `new_key()` written 0600 on the first call."""
        path = self._sftp_folder() / HOST_KEY_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return _read_private(path)
        key = new_key()
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
            handle.flush()
            os.fsync(handle.fileno())
        return key

    def stored_host_key(self) -> bytes | None:
        """The host private key this state folder holds, None when it holds none."""
        path = self.state_dir / "sftp" / HOST_KEY_NAME
        if not path.exists():
            return None
        return _read_private(path)

    def lines(self, client_id: str) -> list[str]:
        """The client's key lines (none without a key file)."""
        try:
            text = self._path(client_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [line.strip() for line in text.splitlines() if line.strip()]

    def times(self, client_id: str) -> KeyTimes:
        """When each key was added and last used (`<client_id>.json`)."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            data = json.loads(self._times_path(client_id).read_text(encoding="utf-8"))
            if isinstance(data, dict):
                return data
        return {}

    def add(self, client_id: str, keys: Sequence[tuple[str, str]]) -> list[str]:
        """Append the keys the file does not hold yet; their fingerprints."""
        with self._lock():
            present = self._keys(client_id)
            added = [(fp, line) for fp, line in dict(keys).items() if fp not in present]
            if added:
                self._write(client_id, [*present.values(), *(line for _, line in added)])
                times = self.times(client_id)
                for fingerprint, _ in added:
                    times[fingerprint] = {"added_at": now()}
                self._write_times(client_id, times)
        return [fingerprint for fingerprint, _ in added]

    def remove(self, client_id: str, fingerprint: str) -> bool:
        """Rewrite the file without the key."""
        with self._lock():
            present = self._keys(client_id)
            if present.pop(fingerprint, None) is None:
                return False
            self._write(client_id, list(present.values()))
            times = self.times(client_id)
            if times.pop(fingerprint, None) is not None:
                self._write_times(client_id, times)
        return True

    def remove_all(self, client_id: str) -> int:
        """Delete the client's key file and its times."""
        with self._lock():
            count = len(self._keys(client_id))
            for path in (self._path(client_id), self._times_path(client_id)):
                path.unlink(missing_ok=True)
        return count

    def note_use(self, client_id: str, fingerprint: str, step: timedelta) -> None:
        """Write the key's last use when the one written is older than `step`."""
        with self._lock():
            times = self.times(client_id)
            used = times.get(fingerprint, {}).get("last_used_at")
            if used is not None and utcnow() - parse(used) < step:
                return
            times.setdefault(fingerprint, {})["last_used_at"] = now()
            self._write_times(client_id, times)

    def close(self) -> None:
        """Nothing is held open."""

    def _keys(self, client_id: str) -> dict[str, str]:
        """fingerprint -> line of the file's keys (a line holding no key is dropped at
        the next rewrite: a hand-edited bad line never locks the other keys out)."""
        keys: dict[str, str] = {}
        for line in self.lines(client_id):
            fingerprint = fingerprint_of(line)
            if fingerprint is not None:
                keys.setdefault(fingerprint, line)
        return keys

    def _path(self, client_id: str) -> Path:
        if not is_valid_id(client_id):
            raise NotFoundError(f"no client {client_id!r}")
        return self.folder / f"{client_id}.pub"

    def _times_path(self, client_id: str) -> Path:
        return self._path(client_id).with_suffix(".json")

    def _lock(self) -> FileLock:
        self._sftp_folder()
        self.folder.mkdir(mode=0o700, exist_ok=True)
        return FileLock(str(self.folder / ".keys.lock"))

    def _write(self, client_id: str, lines: list[str]) -> None:
        write_atomically(self._path(client_id), "".join(f"{line}\n" for line in lines))

    def _write_times(self, client_id: str, times: KeyTimes) -> None:
        write_atomically(self._times_path(client_id), json.dumps(times, sort_keys=True))


def _read_private(path: Path) -> bytes:
    """The key file's bytes, refused when others may read it."""
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & 0o077:
            raise ConfigError(f"{path} is readable by others (mode {mode:o}): chmod 600 it")
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the SFTP host key ({exc})") from None
