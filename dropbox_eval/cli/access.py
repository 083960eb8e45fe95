"""`dropbox-eval clients keys / revoke-key / disable / enable / remove`: who may come in.

A client's keys are its API keys (`ak_...`, billing/apikeys.py) and its SFTP keys (their
`SHA256:...` fingerprint, sftp/keys.py): one list and one revoke for both. Each change is
recorded in the audit log (audit.py). asyncssh loads only with the SFTP key store.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..views import Views, client_view
from . import FOLDERS, STATE, Context, uses
from .audit import audited
from .output import console, emit_json, friendly_errors, json_option

SFTP_KEY_PREFIX = "SHA256:"


def _sftp_keys(obj: Context) -> Any:
    from ..sftp.keys import KeyStore

    settings = obj.settings()
    return KeyStore(settings.state_path, settings.database_url)


@click.command("keys")
@click.argument("client_id")
@json_option
@uses(*STATE)
@click.pass_obj
def keys_command(obj: Context, client_id: str, as_json: bool) -> None:
    """List CLIENT_ID's keys: API keys and SFTP keys, with id, kind, when added and last
    used (to the hour); never a key."""
    with friendly_errors(as_json):
        rows = Views(obj.store()).api_keys(client_id)
        with _sftp_keys(obj) as sftp_keys:
            listed = sftp_keys.listed(client_id)
        rows += [row | {"fingerprint": row["key_id"]} for row in listed]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"{client_id} has no key")
        return
    table = Table("key id", "kind", "added", "last used", "comment")
    for row in rows:
        cells = (row["key_id"], row["kind"], row["created_at"], row["last_used_at"])
        comment = f"{row['algorithm']} {row['comment']}".strip() if row["kind"] == "sftp" else ""
        table.add_row(*(Text(cell or "-") for cell in cells), Text(comment))
    console.print(table)


@click.command("revoke-key")
@click.argument("client_id")
@click.argument("key_id")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def revoke_key_command(obj: Context, client_id: str, key_id: str, as_json: bool) -> None:
    """Revoke CLIENT_ID's key KEY_ID (an API key `ak_...` answers 401 from the next
    request; an SFTP key `SHA256:...` logs in no more, open sessions go on)."""
    kind = "sftp" if key_id.startswith(SFTP_KEY_PREFIX) else "api"
    with friendly_errors(as_json), audited(obj, "clients revoke-key", client_id, key=key_id):
        app = obj.app(with_forge=False)
        if kind == "sftp":
            app.billing.client(client_id)  # a known client, as for API keys
            with _sftp_keys(obj) as sftp_keys:
                sftp_keys.remove(client_id, key_id)
        else:
            app.billing.revoke_api_key(client_id, key_id)
    if as_json:
        emit_json({"ok": True, "client_id": client_id, "key_id": key_id, "kind": kind})
    else:
        click.echo(f"revoked {kind} key {key_id} of {client_id}")


def _standing_command(name: str, help_text: str) -> click.Command:
    """`clients disable` / `clients enable`: one change of the client's standing."""

    @click.command(name, help=help_text)
    @click.argument("client_id")
    @json_option
    @uses(*FOLDERS)
    @click.pass_obj
    def command(obj: Context, client_id: str, as_json: bool) -> None:
        with friendly_errors(as_json), audited(obj, f"clients {name}", client_id):
            billing = obj.app(with_forge=False).billing
            client = billing.disable(client_id) if name == "disable" else billing.enable(client_id)
        view = client_view(client)
        if as_json:
            emit_json({"ok": True, **view})
        else:
            click.echo(f"{client_id}: {view['state']}")

    return command


disable_command = _standing_command(
    "disable",
    "Refuse CLIENT_ID's new work at every door (drops rejected `client_disabled`, the API "
    "answers 403, SFTP logins refused); its running batches finish and are delivered.",
)
enable_command = _standing_command("enable", "Take CLIENT_ID's new work again.")


@click.command("remove")
@click.argument("client_id")
@click.option(
    "--write-off",
    is_flag=True,
    help="Post the credits left as a `write_off` ledger entry (refund them elsewhere first).",
)
@json_option
@uses(*FOLDERS)
@click.pass_obj
def remove_command(obj: Context, client_id: str, write_off: bool, as_json: bool) -> None:
    """Close CLIENT_ID's account once settled: no batch running or undelivered, nothing
    held, balance zero (or --write-off). Its ledger and batches stay; its keys and secret
    go; its id is never reused."""
    with (
        friendly_errors(as_json),
        audited(obj, "clients remove", client_id, write_off=write_off or None) as detail,
    ):
        billing = obj.app(with_forge=False).billing
        balance = billing.client(client_id).balance
        client = billing.remove(client_id, write_off=write_off)
        detail["written_off"] = balance or None
        with _sftp_keys(obj) as sftp_keys:
            detail["sftp_keys"] = sftp_keys.remove_all(client_id) or None
    if as_json:
        emit_json({"ok": True, **client_view(client), "written_off": balance})
        return
    click.echo(f"{client_id}: removed; its ledger stays (`clients show {client_id}`)")
    if balance:
        click.echo(f"{balance} credits written off")


ACCESS_COMMANDS = [
    keys_command,
    revoke_key_command,
    disable_command,
    enable_command,
    remove_command,
]
