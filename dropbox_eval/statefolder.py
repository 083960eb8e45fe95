"""The state folder as commands that only look open it (a light module: no forge client)."""

from __future__ import annotations

from .config import Settings
from .errors import ConfigError, NoState
from .store import Store


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
