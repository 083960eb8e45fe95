"""The `dropbox-eval` command line (exit codes: errors.EXIT_CODES, docs/operating.md).

Every setting flag is accepted before or after the sub-command (`dropbox-eval batches
--home x` and `dropbox-eval --home x batches`), and each one names its environment variable
in `--help`. Secrets never need the command line: the forge token comes from
`SAAS_EVAL_GITEA_TOKEN` or the file named by `--gitea-token-file`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .. import __version__
from ..app import App, build_app, open_state
from ..config import Settings, load_settings
from ..store import Store
from .logs import configure_logging

SETTING_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--home", "home", click.Path(path_type=Path, file_okay=False), "Root folder."),
    ("--inbox", "inbox", click.Path(path_type=Path), "Drop folder (under home)."),
    ("--output-dir", "output_dir", click.Path(path_type=Path), "Reports folder."),
    ("--state-dir", "state_dir", click.Path(path_type=Path), "State folder."),
    ("--gitea-url", "gitea_url", str, "Forge root URL."),
    (
        "--gitea-token-file",
        "gitea_token_file",
        click.Path(path_type=Path, dir_okay=False),
        "File holding the forge token (or set SAAS_EVAL_GITEA_TOKEN).",
    ),
    ("--owner", "owner", str, "User or org owning eval repos."),
    ("--repo", "repo", str, "Shared owner/name repo."),
    ("--poll-interval", "poll_interval", float, "Seconds between poll cycles."),
    ("--task-price", "task_price", int, "Credits per task."),
]
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
LONG_RUNNING = frozenset({"run", "serve", "sandbox", "sftp"})  # they log INFO by default


class Context:
    """Setting overrides from the command line, resolved lazily into Settings."""

    def __init__(self, overrides: dict[str, Any] | None = None) -> None:
        self.overrides: dict[str, Any] = overrides or {}

    def settings(self, **more: Any) -> Settings:
        """Environment + command-line overrides."""
        return load_settings(**{**self.overrides, **more})

    def app(self, **more: Any) -> App:
        """The wired components (creates the folders it needs)."""
        return build_app(self.settings(**more))

    def store(self) -> Store:
        """The state opened read-only: creates nothing; exit 2 when there is none."""
        return open_state(self.settings())


class SettingOption(click.Option):
    """A setting flag: `--help` names its variable, but the settings read the variable
    (one validation, one-line errors naming it), so click leaves the environment alone."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        """Never from the environment here (see the class docstring)."""
        return None


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a setting typed on the command line (wherever it stands; after the sub-command
    wins over before it)."""
    if value is not None and param.name:
        ctx.ensure_object(Context).overrides[param.name] = value
    return value


def settings_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The setting flags, accepted on the group and on every command."""
    for flag, name, kind, text in reversed(SETTING_OPTIONS):
        func = click.option(
            flag,
            name,
            type=kind,
            help=text,
            default=None,
            envvar=f"SAAS_EVAL_{name.upper()}",
            show_envvar=True,
            expose_value=False,
            callback=_remember,
            is_eager=True,
            cls=SettingOption,
        )(func)
    return func


class SettingsGroup(click.Group):
    """A group whose commands (and sub-groups' commands) all take the setting flags."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Register `cmd` with the setting flags added to it."""
        _add_setting_params(cmd)
        super().add_command(cmd, name)


def _add_setting_params(cmd: click.Command) -> None:
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _add_setting_params(sub)
        return
    known = {p.name for p in cmd.params}
    probe = settings_options(lambda: None)
    for param in reversed(getattr(probe, "__click_params__", [])):
        if param.name not in known:
            cmd.params.append(param)


@click.group(cls=SettingsGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="dropbox-eval")
@click.option(
    "-v", "--verbose", count=True, help="More logging: -v info (one-shot commands), -vv debug."
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="SAAS_EVAL_LOG_FORMAT",
    show_envvar=True,
    show_default=True,
    help="json: one JSON object per log line (for log shippers).",
)
@settings_options
@click.pass_context
def main(ctx: click.Context, /, verbose: int, log_format: str) -> None:
    """dropbox-eval: file-drop eval batches -> forge issues -> lane results -> reports."""
    configure_logging(verbose, log_format, service=ctx.invoked_subcommand in LONG_RUNNING)
    ctx.ensure_object(Context)


def _register() -> None:
    from ..sftp.cli import add_key_command, keys_command, remove_key_command, sftp_command
    from . import batches, check, clients, demo, service

    for key_command in (add_key_command, keys_command, remove_key_command):
        clients.clients.add_command(key_command)
    for module in (service, batches, check, demo):
        for command in module.COMMANDS:
            main.add_command(command)
    main.add_command(sftp_command)
    main.add_command(clients.clients)


_register()
