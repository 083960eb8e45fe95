"""`dropbox-eval clients ...`: accounts, credits, secrets and API keys."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..errors import NotFoundError
from ..models import Client
from . import Context
from .output import console, emit_json, friendly_errors, json_option


@click.group()
def clients() -> None:
    """Client accounts and credits."""


@clients.command("add")
@click.argument("client_id")
@click.option("--credits", type=click.IntRange(min=0), default=0, show_default=True)
@json_option
@click.pass_obj
def clients_add(obj: Context, client_id: str, credits: int, as_json: bool) -> None:
    """Create a client account (prints its webhook secret once)."""
    with friendly_errors():
        client = obj.app().billing.add_client(client_id, credits)
    if as_json:
        emit_json(_client_row(client) | {"webhook_secret": client.webhook_secret})
        return
    click.echo(f"{client.client_id}: balance {client.balance}")
    click.echo(f"webhook secret: {client.webhook_secret}")


@clients.command("fund")
@click.argument("client_id")
@click.argument("credits", type=click.IntRange(min=1))
@json_option
@click.pass_obj
def clients_fund(obj: Context, client_id: str, credits: int, as_json: bool) -> None:
    """Add CREDITS (a positive whole number) to a client's balance (a ledger entry)."""
    with friendly_errors():
        client = obj.app().billing.fund(client_id, credits)
    if as_json:
        emit_json(_client_row(client))
        return
    click.echo(f"{client.client_id}: balance {client.balance}")


@clients.command("list")
@json_option
@click.pass_obj
def clients_list(obj: Context, as_json: bool) -> None:
    """List every client with balance, held, available (reads the state, writes nothing)."""
    with friendly_errors():
        rows = [_client_row(c) for c in obj.store().list_clients()]
    if as_json:
        emit_json(rows)
        return
    _print_clients(rows)


@clients.command("rotate-secret")
@click.argument("client_id")
@click.pass_obj
def clients_rotate_secret(obj: Context, client_id: str) -> None:
    """Replace the client's webhook signing secret and print the new one."""
    with friendly_errors():
        click.echo(obj.app().billing.rotate_secret(client_id))


@clients.command("api-key")
@click.argument("client_id")
@click.pass_obj
def clients_api_key(obj: Context, client_id: str) -> None:
    """Issue an API key for the HTTP API (printed once; only its hash is stored)."""
    with friendly_errors():
        click.echo(obj.app().billing.new_api_key(client_id))


@clients.command("show")
@click.argument("client_id", required=False)
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Newest N entries."
)
@click.option("--all", "show_all", is_flag=True, help="The whole ledger.")
@json_option
@click.pass_obj
def clients_show(
    obj: Context, client_id: str | None, limit: int, show_all: bool, as_json: bool
) -> None:
    """Show all clients, or one client with its newest ledger entries (`--all`: every one)."""
    with friendly_errors():
        store = obj.store()
        if client_id is None:
            rows = [_client_row(c) for c in store.list_clients()]
            ledger: list[dict[str, Any]] = []
        else:
            client = store.get_client(client_id)
            if client is None:
                raise NotFoundError(f"no client {client_id!r}")
            rows = [_client_row(client)]
            newest = store.ledger(client_id, limit=None if show_all else limit)
            ledger = [e.model_dump(mode="json") for e in newest]
    if as_json:
        emit_json(rows[0] | {"ledger": ledger} if client_id else rows)
        return
    _print_clients(rows)
    if client_id:
        entries = Table("at", "kind", "amount", "balance after", "held after", "batch", "note")
        for e in ledger:
            entries.add_row(
                e["at"][:19],
                e["kind"],
                str(moved(e)),
                str(e["balance_after"]),
                str(e["held_after"]),
                e.get("batch_id") or "",
                e.get("note") or "",
            )
        console.print(entries)


def moved(entry: dict[str, Any]) -> int:
    """The credits an entry moves: the balance change, or for a hold or release (which
    leave the balance alone) the change of the held amount."""
    return int(entry["amount"]) or int(entry["held_change"])


def _print_clients(rows: list[dict[str, Any]]) -> None:
    table = Table("client", "balance", "held", "available", "since")
    for row in rows:
        table.add_row(
            row["client_id"],
            str(row["balance"]),
            str(row["held"]),
            str(row["available"]),
            row["created_at"][:19],
        )
    console.print(table)


def _client_row(client: Client) -> dict[str, Any]:
    row = client.model_dump(mode="json", exclude={"api_key_hashes", "webhook_secret"})
    row["available"] = client.available
    row["api_keys"] = len(client.api_key_hashes)
    return row
