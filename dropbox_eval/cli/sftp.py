"""Commands: `dropbox-eval sftp` and `dropbox-eval clients add-key / keys / remove-key`.

asyncssh is imported only when a command runs, so the rest of the command line starts as
fast as before.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from ..config import Settings
from ..errors import NotFoundError
from ..views import Views
from . import FOLDERS, STATE, Context, uses
from .output import emit_json, friendly_errors, json_option


def _existing_client(obj: Context, client_id: str, *, writing: bool) -> Settings:
    """The settings, once the client is known (a writing command fixes an old state
    folder's permissions first, as every writing command does)."""
    settings = obj.settings()
    store = obj.app(with_forge=False).store if writing else obj.store()
    try:
        Views(store).client(client_id, ledger_limit=0)
    except NotFoundError:
        raise NotFoundError(f"no client {client_id!r} (create it with `clients add`)") from None
    return settings


def _key_row(key: Any) -> dict[str, str]:
    return {"fingerprint": key.fingerprint, "algorithm": key.algorithm, "comment": key.comment}


def _key_line(verb: str, key: Any) -> str:
    return f"{verb} {key.fingerprint} ({key.algorithm} {key.comment})".rstrip()


@click.command("sftp")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=2222, show_default=True, help="0 picks a free port.")
@json_option
@uses("home", "inbox", "state_dir")
@click.pass_obj
def sftp_command(obj: Context, host: str, port: int, as_json: bool) -> None:
    """Run the SFTP endpoint beside `run` (keys: `clients add-key`; until SIGINT/SIGTERM)."""
    from ..sftp.server import serve

    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one line per event is ours

    def ready(bound_host: str, bound_port: int, fingerprint: str) -> None:
        if as_json:
            emit_json({"host": bound_host, "port": bound_port, "host_key": fingerprint}, lines=True)
        else:
            click.echo(f"sftp endpoint listening on {bound_host}:{bound_port}")
            click.echo(f"host key fingerprint: {fingerprint}")
        sys.stdout.flush()

    with friendly_errors(as_json):
        obj.store()  # the state must be there: the endpoint creates none (NoState)
        serve(obj.settings(), host, port, ready)


@click.command("add-key")
@click.argument("client_id")
@click.argument("keyfile", type=click.File("r", encoding="utf-8"))
@json_option
@uses(*FOLDERS)
@click.pass_obj
def add_key_command(obj: Context, client_id: str, keyfile: Any, as_json: bool) -> None:
    """Let CLIENT_ID log in to the SFTP endpoint with the public key(s) in KEYFILE (- = stdin)."""
    from ..sftp.keys import KeyStore

    with friendly_errors(as_json):
        settings = _existing_client(obj, client_id, writing=True)
        added = KeyStore(settings.state_path).add(client_id, keyfile.read())
    if as_json:
        emit_json({"ok": True, "client_id": client_id, "added": [_key_row(k) for k in added]})
        return
    for key in added:
        click.echo(_key_line("added", key))
    if not added:
        click.echo("already present: nothing added")


@click.command("keys")
@click.argument("client_id")
@json_option
@uses(*STATE)
@click.pass_obj
def keys_command(obj: Context, client_id: str, as_json: bool) -> None:
    """List CLIENT_ID's SFTP keys (fingerprint, algorithm, comment)."""
    from ..sftp.keys import KeyStore

    with friendly_errors(as_json):
        settings = _existing_client(obj, client_id, writing=False)
        keys = KeyStore(settings.state_path).keys(client_id)
    if as_json:
        emit_json([_key_row(k) for k in keys])
        return
    for key in keys:
        click.echo(f"{key.fingerprint}  {key.algorithm}  {key.comment}".rstrip())
    if not keys:
        click.echo(f"{client_id} has no SFTP key")


@click.command("remove-key")
@click.argument("client_id")
@click.argument("fingerprint")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def remove_key_command(obj: Context, client_id: str, fingerprint: str, as_json: bool) -> None:
    """Stop accepting the key FINGERPRINT (SHA256:...) for CLIENT_ID; open sessions go on."""
    from ..sftp.keys import KeyStore

    with friendly_errors(as_json):
        settings = _existing_client(obj, client_id, writing=True)
        key = KeyStore(settings.state_path).remove(client_id, fingerprint)
    if as_json:
        emit_json({"ok": True, "client_id": client_id, "removed": _key_row(key)})
    else:
        click.echo(_key_line("removed", key))


KEY_COMMANDS = [add_key_command, keys_command, remove_key_command]
COMMANDS = [sftp_command]
