"""The state folder as commands that only look open it (a light module: no forge client)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .config import Settings
from .errors import ConfigError, NoState
from .store import Store

log = logging.getLogger("dropbox_eval")


def open_state(settings: Settings) -> Store:
    """The store opened read-only, for commands that only look: creates nothing, and says
    where it looked when there is no state there (NoState, exit 2)."""
    check_state_path(settings)
    try:
        return Store(settings.state_path, read_only=True)
    except NoState:
        raise NoState(
            f"no dropbox-eval state at {settings.state_path}: point --home or --state-dir "
            "(SAAS_EVAL_HOME / SAAS_EVAL_STATE_DIR) at the service's folder"
        ) from None


def check_state_path(settings: Settings) -> None:
    """A one-line error when the state folder's path names something else."""
    path = settings.state_path
    if path.exists() and not path.is_dir():
        raise ConfigError(f"SAAS_EVAL_STATE_DIR: {path} is not a folder")


def make_drop_folders(settings: Settings, *, new_state: bool) -> None:
    """The outbox when nothing is at its path, and the inbox only with a new state folder.

    A missing inbox later is a share not mounted yet or a folder removed: made again here,
    it would take drops on the disk beneath the mount point, so the service waits for it
    instead (InboxWatcher.keep). Nothing is made through a dangling symlink.
    """
    folders = [settings.outbox_path] + ([settings.inbox_path] if new_state else [])
    for folder in folders:
        _make_folder(folder)


def _make_folder(path: Path) -> None:
    if os.path.lexists(path):
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent on a share not mounted, no permission: said, not fatal
        log.warning("cannot make the folder %s: %s", path, exc.strerror or exc)
