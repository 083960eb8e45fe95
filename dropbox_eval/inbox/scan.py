"""Which entries of the inbox are candidates: `.json` files at the top or in a client folder
(the rule itself is namefilter.NAMES, shared with the watcher and the SFTP view)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..protocol.namefilter import NAMES
from ..util.names import OUTCOME_DIRS, TEMP_SUFFIXES

__all__ = ["OUTCOME_DIRS", "TEMP_SUFFIXES", "candidates", "dropped_entries", "is_candidate_name"]

log = logging.getLogger("dropbox_eval")


def is_candidate_name(root: Path, path: Path) -> bool:
    """A `.json` file in the inbox or one client folder below it, not hidden or temporary
    (namefilter.NameFilter.is_candidate)."""
    return NAMES.is_candidate(root, path)


def candidates(root: Path) -> list[Path]:
    """Every candidate entry present now, without following symlinked folders."""
    found = (Path(entry.path) for entry in dropped_entries(root))
    return sorted(path for path in found if is_candidate_name(root, path))


def dropped_entries(root: Path) -> Iterator[os.DirEntry[str]]:
    """Every entry that is not a folder, at the top of the inbox and in each real
    (non-symlink, non-hidden) client folder.

    Never descends into `accepted/`, `rejected/` or another reserved name, so a rescan
    costs the size of the backlog, not history.
    """
    for entry in _list_dir(root):
        if not _is_real_dir(entry):
            yield entry
        elif NAMES.is_client_folder(entry.name):
            yield from (sub for sub in _list_dir(Path(entry.path)) if not _is_real_dir(sub))


def _list_dir(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        log.warning("inbox: cannot list %s: %s", folder, exc)
        return []


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False
