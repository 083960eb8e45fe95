"""`dropbox-eval clients ...`: accounts, credits, secrets and API keys (SFTP keys: sftp.py;
listing and revoking keys, disabling and removing: access.py). Each change is recorded in
the audit log (audit.py).

What they show comes from the read model (views): the same fields as the page.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..views import Views, client_view
from . import FOLDERS, STATE, Context, uses
from .audit import audited
from .output import console, emit_json, friendly_errors, json_option


@click.group()
def clients() -> None:
    """Client accounts and credits."""


@clients.command("add")
@click.argument("client_id")
@click.option(
    "--credits",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Credits to start with (a `fund` ledger entry).",
)
@json_option
@uses(*FOLDERS)
@click.pass_obj
def clients_add(obj: Context, client_id: str, credits: int, as_json: bool) -> None:
    """Create a client account (prints its webhook secret once)."""
    with friendly_errors(as_json), audited(obj, "clients add", client_id, credits=credits):
        client = obj.app(create=True).billing.add_client(client_id, credits)
    if as_json:
        emit_json(client_view(client) | {"webhook_secret": client.webhook_secret})
        return
    click.echo(f"{client.client_id}: balance {client.balance}")
    click.echo(f"webhook secret: {client.webhook_secret}")


@clients.command("fund")
@click.argument("client_id")
@click.argument("credits", type=click.IntRange(min=1))
@json_option
@uses(*FOLDERS)
@click.pass_obj
def clients_fund(obj: Context, client_id: str, credits: int, as_json: bool) -> None:
    """Add CREDITS (a positive whole number) to a client's balance (a ledger entry)."""
    with friendly_errors(as_json), audited(obj, "clients fund", client_id, credits=credits):
        client = obj.app().billing.fund(client_id, credits)
    if as_json:
        emit_json(client_view(client))
        return
    click.echo(f"{client.client_id}: balance {client.balance}")


@clients.command("list")
@json_option
@uses(*STATE)
@click.pass_obj
def clients_list(obj: Context, as_json: bool) -> None:
    """List every client with balance, held, available (reads the state, writes nothing)."""
    with friendly_errors(as_json):
        rows = Views(obj.store()).clients()
    if as_json:
        emit_json(rows)
        return
    _print_clients(rows)


@clients.command("rotate-secret")
@click.argument("client_id")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def clients_rotate_secret(obj: Context, client_id: str, as_json: bool) -> None:
    """Replace the client's webhook signing secret and print the new one."""
    with friendly_errors(as_json), audited(obj, "clients rotate-secret", client_id):
        secret = obj.app().billing.rotate_secret(client_id)
    _show_once(client_id, "webhook_secret", secret, as_json)


@clients.command("api-key")
@click.argument("client_id")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def clients_api_key(obj: Context, client_id: str, as_json: bool) -> None:
    """Issue an API key for the HTTP API: its id (for `keys` and `revoke-key`) and the key,
    printed once (only its hash is stored); the client's other keys stay valid."""
    with friendly_errors(as_json), audited(obj, "clients api-key", client_id) as detail:
        issued = obj.app().billing.issue_api_key(client_id)
        detail["key"] = issued.key_id
    if as_json:
        emit_json(
            {"ok": True, "client_id": client_id, "key_id": issued.key_id, "key": issued.key}
            | {"api_key": issued.key}  # the name of earlier versions
        )
    else:
        click.echo(f"key id: {issued.key_id}", err=True)
        click.echo(issued.key)


def _show_once(client_id: str, name: str, secret: str, as_json: bool) -> None:
    """A secret printed once (only its hash, or the store, keeps it)."""
    if as_json:
        emit_json({"ok": True, "client_id": client_id, name: secret})
    else:
        click.echo(secret)


@clients.command("show")
@click.argument("client_id", required=False)
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Newest N entries."
)
@click.option("--all", "show_all", is_flag=True, help="The whole ledger.")
@json_option
@uses(*STATE)
@click.pass_obj
def clients_show(
    obj: Context, client_id: str | None, limit: int, show_all: bool, as_json: bool
) -> None:
    """Show all clients, or one client with its newest ledger entries (`--all`: every one)."""
    with friendly_errors(as_json):
        views = Views(obj.store())
        shown: Any = (
            views.clients()
            if client_id is None
            else views.client(client_id, ledger_limit=None if show_all else limit)
        )
    if as_json:
        emit_json(shown)
        return
    if client_id is None:
        _print_clients(shown)
        return
    _print_clients([shown])
    entries = Table("at", "kind", "amount", "balance after", "held after", "batch", "note")
    for e in shown["ledger"]:
        entries.add_row(
            e["at"],
            e["kind"],
            str(e["moved"]),
            str(e["balance_after"]),
            str(e["held_after"]),
            e.get("batch_id") or "",
            e.get("note") or "",
        )
    console.print(entries)


def _print_clients(rows: list[dict[str, Any]]) -> None:
    table = Table("client", "state", "balance", "held", "available", "since")
    for row in rows:
        table.add_row(
            row["client_id"],
            row["state"],
            str(row["balance"]),
            str(row["held"]),
            str(row["available"]),
            row["created_at"],
        )
    console.print(table)


def _with_key_commands() -> None:
    from .access import ACCESS_COMMANDS  # `keys`, `revoke-key`, `disable`, `enable`, `remove`
    from .sftp import KEY_COMMANDS  # `clients add-key`, `remove-key`

    for command in [*KEY_COMMANDS, *ACCESS_COMMANDS]:
        clients.add_command(command)


_with_key_commands()
COMMANDS = [clients]
