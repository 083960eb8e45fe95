"""Commands: `dropbox-eval sftp` and `dropbox-eval clients add-key / keys / remove-key`.

Registered by the main command line (`main.add_command(sftp_command)`, and the three key
commands on the `clients` group). asyncssh is imported only when a command runs, so the
rest of the command line starts as fast as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any, Protocol

import click

from ..config import Settings
from ..errors import (
    AlreadyRunning,
    ConfigError,
    DropboxEvalError,
    InvalidArgument,
    NotFoundError,
)

# the main command line's documented exit codes
EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_RUNNING = 1, 2, 3, 5


class SettingsSource(Protocol):
    """The main command line's context object (`ctx.obj`)."""

    def settings(self, **more: Any) -> Settings:
        """Environment plus command-line overrides."""
        ...


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """One line on stderr and the main command line's exit code for each project error."""
    codes: list[tuple[type[DropboxEvalError], int]] = [
        (ConfigError, EXIT_USAGE),
        (InvalidArgument, EXIT_USAGE),
        (NotFoundError, EXIT_NOT_FOUND),
        (AlreadyRunning, EXIT_RUNNING),
        (DropboxEvalError, EXIT_FAILED),
    ]
    try:
        yield
    except DropboxEvalError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(next(code for kind, code in codes if isinstance(exc, kind)))


def _existing_client(settings: Settings, client_id: str) -> None:
    from ..app import build_app

    if build_app(settings, with_forge=False).store.get_client(client_id) is None:
        raise NotFoundError(f"no client {client_id!r} (create it with `clients add`)")


@click.command("sftp")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=2222, show_default=True, help="0 picks a free port.")
@click.pass_obj
def sftp_command(obj: SettingsSource, host: str, port: int) -> None:
    """Run the SFTP endpoint beside `run` (keys: `clients add-key`; until SIGINT/SIGTERM)."""
    from .server import serve

    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one line per event is ours

    def ready(bound_host: str, bound_port: int, fingerprint: str) -> None:
        click.echo(f"sftp endpoint listening on {bound_host}:{bound_port}")
        click.echo(f"host key fingerprint: {fingerprint}")
        sys.stdout.flush()

    with _errors():
        serve(obj.settings(), host, port, ready)


@click.command("add-key")
@click.argument("client_id")
@click.argument("keyfile", type=click.File("r", encoding="utf-8"))
@click.pass_obj
def add_key_command(obj: SettingsSource, client_id: str, keyfile: Any) -> None:
    """Let CLIENT_ID log in to the SFTP endpoint with the public key(s) in KEYFILE (- = stdin)."""
    from .keys import KeyStore

    with _errors():
        settings = obj.settings()
        _existing_client(settings, client_id)
        store = KeyStore(settings.state_path)
        added = store.add(client_id, keyfile.read())
    for key in added:
        click.echo(f"added {key.fingerprint} ({key.algorithm} {key.comment})".rstrip())
    if not added:
        click.echo("already present: nothing added")


@click.command("keys")
@click.argument("client_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def keys_command(obj: SettingsSource, client_id: str, as_json: bool) -> None:
    """List CLIENT_ID's SFTP keys (fingerprint, algorithm, comment)."""
    from .keys import KeyStore

    with _errors():
        settings = obj.settings()
        _existing_client(settings, client_id)
        keys = KeyStore(settings.state_path).keys(client_id)
    if as_json:
        rows = [
            {"fingerprint": k.fingerprint, "algorithm": k.algorithm, "comment": k.comment}
            for k in keys
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    for key in keys:
        click.echo(f"{key.fingerprint}  {key.algorithm}  {key.comment}".rstrip())
    if not keys:
        click.echo(f"{client_id} has no SFTP key")


@click.command("remove-key")
@click.argument("client_id")
@click.argument("fingerprint")
@click.pass_obj
def remove_key_command(obj: SettingsSource, client_id: str, fingerprint: str) -> None:
    """Stop accepting the key FINGERPRINT (SHA256:...) for CLIENT_ID; open sessions go on."""
    from .keys import KeyStore

    with _errors():
        settings = obj.settings()
        _existing_client(settings, client_id)
        key = KeyStore(settings.state_path).remove(client_id, fingerprint)
    click.echo(f"removed {key.fingerprint} ({key.algorithm} {key.comment})".rstrip())
