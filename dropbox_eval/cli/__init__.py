"""The `dropbox-eval` command line (exit codes: see output.py and the README)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..app import App, build_app
from ..config import Settings, load_settings

SETTING_OPTIONS: list[tuple[str, str, Any]] = [
    ("--home", "home", click.Path(path_type=Path)),
    ("--inbox", "inbox", click.Path(path_type=Path)),
    ("--output-dir", "output_dir", click.Path(path_type=Path)),
    ("--state-dir", "state_dir", click.Path(path_type=Path)),
    ("--gitea-url", "gitea_url", str),
    ("--gitea-token", "gitea_token", str),
    ("--owner", "owner", str),
    ("--repo", "repo", str),
    ("--poll-interval", "poll_interval", float),
    ("--task-price", "task_price", int),
]


class Context:
    """Setting overrides from the command line, resolved lazily into Settings."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides

    def settings(self, **more: Any) -> Settings:
        """Environment + command-line overrides."""
        return load_settings(**{**self.overrides, **more})

    def app(self, **more: Any) -> App:
        """The wired components."""
        return build_app(self.settings(**more))


def _settings_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for flag, name, kind in reversed(SETTING_OPTIONS):
        env = f"SAAS_EVAL_{name.upper()}"
        func = click.option(flag, name, type=kind, default=None, help=f"Overrides {env}.")(func)
    return func


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@_settings_options
@click.pass_context
def main(ctx: click.Context, /, verbose: bool, **overrides: Any) -> None:
    """dropbox-eval: file-drop eval batches -> forge issues -> lane results -> reports."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("urllib3", "watchdog", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ctx.obj = Context(overrides)


def _register() -> None:
    from ..sftp.cli import add_key_command, keys_command, remove_key_command, sftp_command
    from . import batches, clients, demo, service

    for module in (service, batches, demo):
        for command in module.COMMANDS:
            main.add_command(command)
    main.add_command(sftp_command)
    for key_command in (add_key_command, keys_command, remove_key_command):
        clients.clients.add_command(key_command)
    main.add_command(clients.clients)


_register()
