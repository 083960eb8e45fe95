"""Whether a command runs with the running service's configuration, in what matters: the
forge it writes to, the folders it reads and writes, and the callback policy it delivers
under. The service publishes these in its status file at start (`settings` of
service.json); `dropbox-eval status` compares them with its own and names each that
differs (a command run from a shell without the units' environment file would otherwise
act on another forge or folder, or refuse a callback the service allows)."""

from __future__ import annotations

from typing import Any

from ..config import ENV_PREFIX, Settings

WHAT_MATTERS = {
    "gitea_url": "forge",
    "owner": "forge",
    "repo": "forge",
    "inbox": "folders",
    "output_dir": "folders",
    "state_dir": "folders",
    "callback_allow": "callback policy",
}
"""Each compared setting and what it is part of."""


def published(settings: Settings) -> dict[str, Any]:
    """The settings that matter as the service publishes them (folders as absolute paths,
    so that two homes that name the same folder agree; never a secret)."""
    folders = {
        "inbox": settings.inbox_path,
        "output_dir": settings.outbox_path,
        "state_dir": settings.state_path,
    }
    return {
        "gitea_url": settings.gitea_url,
        "owner": settings.owner,
        "repo": settings.repo,
        **{name: str(path.resolve()) for name, path in folders.items()},
        "callback_allow": settings.callback_allow,
    }


def differences(mine: dict[str, Any], service: dict[str, Any]) -> list[str]:
    """One line per setting that matters and differs: `forge: SAAS_EVAL_GITEA_URL is ...
    here, ... in the running service`; nothing when the service published none (an older
    version)."""
    if not service:
        return []
    return [
        f"{part}: {ENV_PREFIX}{name.upper()} is {_shown(mine.get(name))} here, "
        f"{_shown(service.get(name))} in the running service"
        for name, part in WHAT_MATTERS.items()
        if name in service and mine.get(name) != service.get(name)
    ]


def _shown(value: Any) -> str:
    return "unset" if value in (None, "") else repr(value)
