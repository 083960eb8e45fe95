"""The state folder: whether one is there, opening it to look, and the drop folders of a
new one (a light module: no forge client).

Only the commands that set a service up create a state folder (`clients add`, `demo`,
`run` without `--once`: they build the app with `create=True`); every other command needs
one to be there and says so in one line (NoState, exit 2), creating nothing. A mistyped
home or a volume not mounted yet is then an error, not a new, empty service.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..config import Settings
from ..errors import ConfigError, NoState
from .contract import Store
from .engine import TinyDBStore
from .sftpkeyfiles import SftpKeyFiles
from .sftpkeys import SftpKeys

log = logging.getLogger("dropbox_eval")


def open_store(
    state_dir: Path, *, read_only: bool = False, database_url: str | None = None
) -> Store:
    """The store: the one place that chooses its engine. PostgreSQL when `database_url`
    is set (SAAS_EVAL_DATABASE_URL; store/pg/, imported only then), else TinyDB in the
    state folder. A read-only one creates nothing (NoState when there is no state)."""
    if database_url:
        from .pg.engine import PostgresStore  # psycopg: only a service that uses it

        return PostgresStore(database_url, state_dir, read_only=read_only)
    return TinyDBStore(state_dir, read_only=read_only)


def open_sftp_keys(state_dir: Path, database_url: str | None = None) -> SftpKeys:
    """The SFTP endpoint's keys, where the store is: in the database when `database_url`
    is set (every node shares them; a host key this state folder holds is offered when the
    database has none yet), else in files under the state folder."""
    if database_url:
        from .pg.sftpkeys import PgSftpKeys  # psycopg: only a service that uses it

        return PgSftpKeys(database_url, local=SftpKeyFiles(state_dir).stored_host_key)
    return SftpKeyFiles(state_dir)


def open_state(settings: Settings) -> Store:
    """The store opened read-only, for commands that only look: creates nothing, and says
    where it looked when there is no state there (NoState, exit 2)."""
    check_state_path(settings)
    try:
        return open_store(settings.state_path, read_only=True, database_url=settings.database_url)
    except NoState:
        raise no_state(settings) from None


def has_state(path: Path, database_url: str | None = None) -> bool:
    """Whether `path` holds a state: its `batches/` folder (what Store(read_only=True)
    looks for). An empty folder, such as a mount point not mounted yet, holds none. On
    PostgreSQL (`database_url`) the folder holds only this node's own files: it is there."""
    if database_url:
        return path.is_dir()
    return (path / "batches").is_dir()


def no_state(settings: Settings) -> NoState:
    """The one line every command says when there is no state where it looks."""
    return NoState(
        f"no dropbox-eval state at {settings.state_path}: point --home or --state-dir "
        "(SAAS_EVAL_HOME / SAAS_EVAL_STATE_DIR) at the service's folder (`dropbox-eval "
        "clients add` or `run` creates a new one)"
    )


def check_state_path(settings: Settings) -> None:
    """A one-line error when the state folder's path names something else."""
    path = settings.state_path
    if path.is_symlink() and not path.exists():
        raise ConfigError(
            f"SAAS_EVAL_STATE_DIR: {path} is a symlink to {os.readlink(path)}, which is "
            "not there (a volume not mounted yet?)"
        )
    if path.exists() and not path.is_dir():
        raise ConfigError(f"SAAS_EVAL_STATE_DIR: {path} is not a folder")


def make_drop_folders(settings: Settings, *, new_state: bool) -> None:
    """The outbox when nothing is at its path, and the inbox only with a new state folder;
    each only inside a folder that is there (never its parents).

    A missing inbox later is a share not mounted yet or a folder removed: made again here,
    it would take drops on the disk beneath the mount point, so the service waits for it
    instead (InboxWatcher.keep). A missing parent is the same case one level up (an inbox
    at /mnt/share/inbox with /mnt/share not mounted). Nothing is made through a dangling
    symlink.
    """
    folders = [settings.outbox_path] + ([settings.inbox_path] if new_state else [])
    for folder in folders:
        _make_folder(folder)


def _make_folder(path: Path) -> None:
    if os.path.lexists(path):
        return
    try:
        path.mkdir()
    except FileNotFoundError:
        log.warning("not making the folder %s: %s is missing (not mounted?)", path, path.parent)
    except OSError as exc:  # no permission, a read-only disk: said, not fatal
        log.warning("cannot make the folder %s: %s", path, exc.strerror or exc)
