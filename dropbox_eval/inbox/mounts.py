"""Which filesystem holds the inbox, from `/proc/self/mountinfo`: inotify reports only the
changes made through this kernel, so on a network share (NFS, SMB/CIFS, 9p, virtiofs) or a
FUSE mount (sshfs, rclone, s3fs ...) a file written by another host, or by the FUSE
server behind the mount, raises no event. The watcher polls there instead.

`remote_mount` is the pure part (mountinfo text in, the mount out, for tests with real
samples); `choose_polling` reads this process's mountinfo and says what to do and why.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_KINDS = {
    "nfs": "NFS",
    "nfs4": "NFS",
    "cifs": "SMB/CIFS",
    "smb3": "SMB/CIFS",
    "smbfs": "SMB/CIFS",
    "9p": "9p",
    "virtiofs": "virtiofs",
    "fuse": "FUSE",
    "fuseblk": "FUSE",
}
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: where it is mounted, the filesystem type and its source."""

    point: str
    fstype: str
    source: str

    @property
    def kind(self) -> str | None:
        """`NFS`, `SMB/CIFS`, `9p`, `virtiofs` or `FUSE` for a filesystem whose remote or
        userspace writes inotify does not see; None for a local one."""
        if self.fstype.startswith("fuse."):
            return "FUSE"
        return _KINDS.get(self.fstype)


def parse_mountinfo(text: str) -> list[Mount]:
    """Every well-formed line of a mountinfo file (proc_pid_mountinfo(5)), in order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3:
            continue
        mounts.append(
            Mount(_unescape(fields[4]), _unescape(fields[dash + 1]), _unescape(fields[dash + 2]))
        )
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding absolute `path`: the longest mount point that is `path` or one of
    its parents; of equal ones the last listed (it was mounted over the others)."""
    holding = [m for m in mounts if path == m.point or path.startswith(m.point.rstrip("/") + "/")]
    best: Mount | None = None
    for mount in holding:  # `>=`: a later mount at the same point was mounted over
        if best is None or len(mount.point.rstrip("/")) >= len(best.point.rstrip("/")):
            best = mount
    return best


def remote_mount(path: str, mountinfo: str) -> Mount | None:
    """The mount holding `path` (absolute, symlinks already resolved) when it is a network
    or FUSE filesystem; None when it is local or not found."""
    mount = mount_of(path, parse_mountinfo(mountinfo))
    return mount if mount is not None and mount.kind is not None else None


def inbox_mount(inbox: Path, mountinfo: Path = MOUNTINFO) -> Mount | None:
    """`remote_mount` for this process's view of `inbox` (symlinks resolved); None where
    there is no mountinfo to read (not Linux)."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None
    return remote_mount(os.path.realpath(inbox), text)


def choose_polling(
    choice: bool | None, inbox: Path, mountinfo: Path = MOUNTINFO
) -> tuple[bool, str | None]:
    """Poll the inbox or use inotify, and the line to log about it (None: nothing to say).

    `choice` is `--polling` (True), `--no-polling` (False) or neither (None: detect)."""
    mount = inbox_mount(inbox, mountinfo)
    if mount is None:
        return bool(choice), None
    where = (
        f"inbox {inbox} is on {mount.kind} ({mount.fstype} {mount.source} mounted at {mount.point})"
    )
    if choice is None:
        return True, (
            f"{where}: polling it, since inotify sees no writes made by other hosts "
            "(--no-polling or SAAS_EVAL_POLLING=false to use inotify anyway)"
        )
    if not choice:
        return False, (
            f"{where}, but polling is off (--no-polling or SAAS_EVAL_POLLING=false): files "
            "written by other hosts are found only by the rescan every "
            "SAAS_EVAL_RESCAN_INTERVAL"
        )
    return True, None


def _unescape(field: str) -> str:
    """Mountinfo writes space, tab, newline and backslash as octal escapes (`\\040`)."""
    return _ESCAPE.sub(lambda match: chr(int(match[1], 8)), field)
