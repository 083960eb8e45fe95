"""The `dropbox-eval` command line (exit codes: errors.EXIT_CODES, README "Exit codes").

The setting flags are accepted before the sub-command (`dropbox-eval --home x batches`), and
after it on the commands that use them (`dropbox-eval batches --home x`; after wins); each
names its environment variable in `--help`. Secrets never need the command line: the forge
token comes from `SAAS_EVAL_GITEA_TOKEN` or the file named by `--gitea-token-file`. Under
`--json` every error is a JSON document on stdout (output.py), usage errors included.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import __version__
from ..errors import EXIT_INTERRUPTED, answer_for, error_document, storage_error
from .catalogue import COMMANDS
from .logs import configure_logging

if TYPE_CHECKING:  # loaded by the commands that use them: `--help` stays light
    from ..app import App
    from ..config import Settings
    from ..service import Service
    from ..store import Store

SETTING_OPTIONS: dict[str, tuple[str, Any, str]] = {
    "home": (
        "--home",
        click.Path(path_type=Path, file_okay=False),
        "Root folder; relative folders are resolved against it.",
    ),
    "inbox": ("--inbox", click.Path(path_type=Path), "Drop folder (under home)."),
    "output_dir": ("--output-dir", click.Path(path_type=Path), "Reports folder (under home)."),
    "state_dir": ("--state-dir", click.Path(path_type=Path), "State folder (under home)."),
    "gitea_url": ("--gitea-url", str, "Forge root URL (without /api/v1)."),
    "gitea_token_file": (
        "--gitea-token-file",
        click.Path(path_type=Path, dir_okay=False),
        "File holding the forge token (or set SAAS_EVAL_GITEA_TOKEN).",
    ),
    "owner": ("--owner", str, "User or org owning eval repos."),
    "repo": ("--repo", str, "Shared owner/name repo (unset: one repo per batch)."),
    "poll_interval": ("--poll-interval", float, "Seconds between poll cycles."),
    "task_price": ("--task-price", int, "Credits per task."),
}
STATE = ("home", "state_dir")
"""What a command that only reads the state needs."""
FOLDERS = ("home", "inbox", "output_dir", "state_dir")
"""What a command that writes the state (and so creates the folders) needs."""
FORGE = ("gitea_url", "gitea_token_file", "owner", "repo")
"""What a command that talks to the forge needs besides the token."""
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
LONG_RUNNING = frozenset({"run", "serve", "sandbox", "sftp"})  # they log INFO by default


class Context:
    """Setting overrides from the command line, resolved lazily into Settings."""

    def __init__(self, overrides: dict[str, Any] | None = None) -> None:
        self.overrides: dict[str, Any] = overrides or {}
        self.env_file: Path | None = None  # `--env-file`: the units' file instead of the shell
        self._store: Store | None = None  # opened once per command, closed as it ends

    def settings(self, **more: Any) -> Settings:
        """Environment (or the `--env-file`) + command-line overrides."""
        from ..config import load_settings

        return load_settings(self.env_file, **{**self.overrides, **more})

    def app(self, *, create: bool = False, with_forge: bool = True, **more: Any) -> App:
        """The wired components, on the state that is there: NoState (exit 2, nothing
        created) when there is none. Only the commands that set a service up pass
        `create` (`clients add`, `demo`, `run` without `--once`; statefolder.py)."""
        from ..app import build_app

        return build_app(self.settings(**more), with_forge=with_forge, create=create)

    def service(
        self, *, create: bool = False, polling: bool | None = None, **more: Any
    ) -> tuple[App, Service]:
        """The service with its workers, and the parts it runs (see `app`)."""
        from ..app import build_service

        return build_service(self.settings(**more), polling=polling, create=create)

    def store(self, *, writable: bool = False) -> Store:
        """The state opened read-only: creates nothing; exit 2 when there is none.
        `writable`: StorageUnavailable (exit 1) when the state folder is full, read-only or
        refused, for the commands that must not say all is well then (`status`, `check`)."""
        from ..store.statefolder import open_state
        from ..util.storage import require_writable

        if self._store is None:
            self._store = open_state(self.settings())
        if writable:
            require_writable(self._store.state_dir)
        return self._store

    def close(self) -> None:
        """Close the store the command opened (a database's pooled connections)."""
        if self._store is not None:
            self._store.close()
            self._store = None


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


F = Callable[..., Any]


def uses(*names: str) -> Callable[[F], F]:
    """Add the setting flags `names` (keys of SETTING_OPTIONS) to a command."""

    def add(func: F) -> F:
        for name in reversed(names):
            flag, kind, text = SETTING_OPTIONS[name]
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

    return add


def _shortened(text: str, limit: int) -> str:
    """`text` cut at a word to fit `limit` characters, with `...` when cut (as click does)."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 3, 1)].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."


class Main(click.Group):
    """The top group: commands load when they run (COMMANDS); under `--json`, a usage
    error is a JSON document on stdout too."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command, without loading one."""
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, its module imported now."""
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module = importlib.import_module(f"{__name__}.{COMMANDS[cmd_name][0]}")
            for command in module.COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of `--help`, from COMMANDS (nothing loaded)."""
        names = [name for name in self.list_commands(ctx) if name in COMMANDS]
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, _shortened(COMMANDS[name][1], limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; see the class docstring. The last net: a full, read-only or
        refused folder met outside a command's `friendly_errors` is one line too."""
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv and standalone_mode
        try:
            if not as_json:
                return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
            return self._main_json(argv, prog_name, complete_var, **extra)
        except OSError as exc:
            error = storage_error(exc)
            if error is None or not standalone_mode:
                raise
            from .output import emit_error  # here: `--help` loads no rich

            emit_error(error_document(error), as_json=as_json)
            sys.exit(answer_for(error)[1])

    def _main_json(
        self, argv: list[str], prog_name: str | None, complete_var: str | None, **extra: Any
    ) -> Any:
        """`main` under `--json`: a usage error is a JSON document on stdout too."""
        from .output import emit_error, problem

        try:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            emit_error(problem("usage", exc.format_message()), as_json=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=Main, context_settings=CONTEXT)
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
@click.option(
    "--env-file",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="SAAS_EVAL_ENV_FILE",
    show_envvar=True,
    help="Read the settings from this file (the systemd units' EnvironmentFile) instead of "
    "the shell's SAAS_EVAL_* variables; flags still win.",
)
@uses(*SETTING_OPTIONS)
@click.pass_context
def main(ctx: click.Context, /, verbose: int, log_format: str, env_file: Path | None) -> None:
    """dropbox-eval: file-drop eval batches -> forge issues -> lane results -> reports."""
    configure_logging(verbose, log_format, service=ctx.invoked_subcommand in LONG_RUNNING)
    ctx.ensure_object(Context).env_file = env_file
    ctx.call_on_close(ctx.obj.close)
