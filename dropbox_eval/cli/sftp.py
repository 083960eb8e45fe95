"""Commands: `dropbox-eval sftp` and `dropbox-eval clients add-key / remove-key` (the list
of a client's keys and `revoke-key`, for API and SFTP keys alike: access.py).

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
from . import FOLDERS, Context, uses
from .audit import audited
from .output import emit_json, friendly_errors, json_option


def _existing_client(obj: Context, client_id: str) -> Settings:
    """The settings, once the client is known and not removed (opening the state to write
    fixes an old state folder's permissions first, as every writing command does)."""
    settings = obj.settings()
    billing = obj.app(with_forge=False).billing
    if billing.store.get_client(client_id) is None:
        raise NotFoundError(f"no client {client_id!r} (create it with `clients add`)")
    billing.client(client_id)  # a removed client's id: says so
    return settings


def _key_row(key: Any) -> dict[str, str]:
    return {"fingerprint": key.fingerprint, "algorithm": key.algorithm, "comment": key.comment}


def _key_line(verb: str, key: Any) -> str:
    return f"{verb} {key.fingerprint} ({key.algorithm} {key.comment})".rstrip()


@click.command("sftp")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0 or :: for clients on other hosts).",
)
@click.option("--port", type=int, default=2222, show_default=True, help="0 picks a free port.")
@click.option(
    "--known-hosts-line",
    "known_hosts_name",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[NAME]",
    help="Print the line a client puts in known_hosts to pin the host key (for the host NAME "
    "clients connect to, else --host; with --port), and exit.",
)
@json_option
@uses("home", "inbox", "state_dir")
@click.pass_obj
def sftp_command(
    obj: Context, host: str, port: int, known_hosts_name: str | None, as_json: bool
) -> None:
    """Run the SFTP endpoint beside `run` (keys: `clients add-key`; until SIGINT/SIGTERM)."""
    from ..sftp.server import serve

    if known_hosts_name is not None:
        _print_known_hosts_line(obj, known_hosts_name or host, port, as_json)
        return

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


def _print_known_hosts_line(obj: Context, name: str, port: int, as_json: bool) -> None:
    from ..sftp.status import known_hosts_line

    with friendly_errors(as_json):
        obj.store()  # the state must be there (NoState): the host key lives in it
        settings = obj.settings()
        line = known_hosts_line(settings.state_path, name, port, settings.database_url)
    if as_json:
        emit_json({"known_hosts_line": line})
    else:
        click.echo(line)


@click.command("add-key")
@click.argument("client_id")
@click.argument("keyfile", type=click.File("r", encoding="utf-8"))
@json_option
@uses(*FOLDERS)
@click.pass_obj
def add_key_command(obj: Context, client_id: str, keyfile: Any, as_json: bool) -> None:
    """Let CLIENT_ID log in to the SFTP endpoint with the public key(s) in KEYFILE (- = stdin)."""
    from ..sftp.keys import KeyStore

    with friendly_errors(as_json), audited(obj, "clients add-key", client_id) as detail:
        settings = _existing_client(obj, client_id)
        with KeyStore(settings.state_path, settings.database_url) as keys:
            added = keys.add(client_id, keyfile.read())
        detail["keys"] = [k.fingerprint for k in added]
    if as_json:
        emit_json({"ok": True, "client_id": client_id, "added": [_key_row(k) for k in added]})
        return
    for key in added:
        click.echo(_key_line("added", key))
    if not added:
        click.echo("already present: nothing added")


@click.command("remove-key")
@click.argument("client_id")
@click.argument("fingerprint")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def remove_key_command(obj: Context, client_id: str, fingerprint: str, as_json: bool) -> None:
    """Stop accepting the key FINGERPRINT (SHA256:...) for CLIENT_ID; open sessions go on."""
    from ..sftp.keys import KeyStore

    with friendly_errors(as_json), audited(obj, "clients remove-key", client_id, key=fingerprint):
        settings = _existing_client(obj, client_id)
        with KeyStore(settings.state_path, settings.database_url) as keys:
            key = keys.remove(client_id, fingerprint)
    if as_json:
        emit_json({"ok": True, "client_id": client_id, "removed": _key_row(key)})
    else:
        click.echo(_key_line("removed", key))


KEY_COMMANDS = [add_key_command, remove_key_command]
COMMANDS = [sftp_command]
