"""Secrets at rest: every folder under the state folder is 0700 and every file 0600.

`index.json` holds every client's webhook secret (`whsec_...`) and API key hashes,
`sftp/keys/<client_id>.pub` says who may log in (`.json` beside it: when each key was
added and last used), `service.json` and the rejection log carry error messages and file
names of every client, the audit log (`audit.jsonl`) who did what to which client. New
files are written 0600 by the one writer (fileio: PRIVATE_MODE is its default; only
receipts, error files, filed drops and reports are written SHARED_MODE for clients), new
state folders are created 0700 here. A
state folder from an earlier version (0755, files 0644) is fixed by `make_state_private`
when a command that writes opens it (`run`, `serve`, `sftp`, `clients add`, ...): one
warning line names what was fixed, so it is logged once. Those commands fix the folders and
files that hold secrets (a cost bounded by the clients with SFTP keys); the service's start
(`run`) walks the whole state folder (`everything`: the archive's ledgers and folders, lock
files), a cost that follows the history, paid once per start.

The process umask is left alone: the inbox and outbox folders the service creates must
stay readable by clients, and what libraries create inside the state folder (filelock's
lock files, journals and archives appended by the store) is covered by the folder's 0700.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..util.fileio import make_folders

log = logging.getLogger("dropbox_eval")

STATE_FOLDER_MODE = 0o700
GROUP_OTHER_BITS = 0o077
PRIVATE_FOLDERS = (".", "sftp", "sftp/keys")
"""Relative to the state folder: made 0700 (and everything below is out of others' reach)."""
SECRET_FILES = (
    "index.json",
    "service.json",
    "rejections.jsonl",
    "rejections.1.jsonl",
    "rejections.counts.json",
    "sftp/status.json",
    "audit.jsonl",
)
"""Relative to the state folder: made 0600 (the host key is checked by the endpoint)."""
SECRET_PATTERNS = (("sftp/keys", "*.pub"), ("sftp/keys", "*.json"))
"""(folder, pattern) relative to the state folder: one file per client, made 0600."""


def private_folder(path: Path) -> Path:
    """`path`, created 0700 if missing (missing parents above it get the usual mode: a
    new home holds folders clients read)."""
    make_folders(path.parent, private=False)
    return make_folders(path)


def tighten_state(state_dir: Path, *, everything: bool = False) -> list[Path]:
    """Take group and other permissions off the state folder, its SFTP folders and the
    files holding secrets (with `everything`, off every folder and file under it); returns
    what was changed (nothing for a folder already private). Symbolic links inside the
    folder are left alone and never followed; without `everything` the cost is bounded by
    the number of clients with SFTP keys, not by the history."""
    changed: list[Path] = []
    for name in PRIVATE_FOLDERS:
        _tighten(state_dir / name, changed, follow=name == ".")
    for name in SECRET_FILES:
        _tighten(state_dir / name, changed, follow=False)
    for folder, pattern in SECRET_PATTERNS:
        if _real_folder(state_dir, folder):  # never through a link to elsewhere
            for path in sorted((state_dir / folder).glob(pattern)):
                _tighten(path, changed, follow=False)
    if everything and _real_folder(state_dir, "."):
        _tighten_below(state_dir, changed)
    return changed


def _tighten_below(state_dir: Path, changed: list[Path]) -> None:
    """Every folder and file under `state_dir` (links left alone, never followed)."""
    for folder, folders, files in os.walk(state_dir):  # os.walk follows no link by default
        for name in sorted(folders) + sorted(files):
            path = Path(folder) / name
            if path not in changed:
                _tighten(path, changed, follow=False)


def make_state_private(state_dir: Path, *, everything: bool = False) -> list[Path]:
    """`tighten_state` at start, logged as one warning when it changed something; a folder
    this process may not chmod (another owner) is logged and left as it is."""
    try:
        changed = tighten_state(state_dir, everything=everything)
    except OSError as exc:
        log.warning(
            "state folder %s: cannot make it private (%s); it holds client secrets: "
            "chmod 700 it and chmod 600 the files in it",
            state_dir,
            exc,
        )
        return []
    if changed:
        log.warning(
            "state folder %s was readable by other users; made private (folders 0700, "
            "files 0600): %s",
            state_dir,
            _listed([_shown(path, state_dir) for path in changed]),
        )
    return changed


def _tighten(path: Path, changed: list[Path], *, follow: bool) -> None:
    try:
        info = os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(info.st_mode):
        return
    mode = stat.S_IMODE(info.st_mode)
    if mode & GROUP_OTHER_BITS:
        os.chmod(path, mode & ~GROUP_OTHER_BITS)
        changed.append(path)


def _real_folder(state_dir: Path, relative: str) -> bool:
    path = state_dir
    for part in Path(relative).parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except (FileNotFoundError, NotADirectoryError):
            return False
    return True


def _listed(names: list[str], most: int = 20) -> str:
    """The first `most` names, and how many more (an old archive has thousands)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _shown(path: Path, state_dir: Path) -> str:
    relative = os.path.relpath(path, state_dir)
    return "the folder itself" if relative == "." else relative
