"""`dropbox-eval clients ...`: accounts, credits, secrets and API keys."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..models import Client
from . import Context
from .output import console, emit_json, friendly_errors, json_option


@click.group()
def clients() -> None:
    """Client accounts and credits."""


@clients.command("add")
@click.argument("client_id")
@click.option("--credits", type=int, default=0, show_default=True)
@click.pass_obj
def clients_add(obj: Context, client_id: str, credits: int) -> None:
    """Create a client account."""
    with friendly_errors():
        client = obj.app().billing.add_client(client_id, credits)
    click.echo(f"{client.client_id}: balance {client.balance}")
    click.echo(f"webhook secret: {client.webhook_secret}")


@clients.command("fund")
@click.argument("client_id")
@click.argument("credits", type=int)
@click.pass_obj
def clients_fund(obj: Context, client_id: str, credits: int) -> None:
    """Add CREDITS to a client's balance (a ledger entry)."""
    with friendly_errors():
        client = obj.app().billing.fund(client_id, credits)
    click.echo(f"{client.client_id}: balance {client.balance}")


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
@json_option
@click.pass_obj
def clients_show(obj: Context, client_id: str | None, as_json: bool) -> None:
    """Show all clients, or one client with its ledger."""
    with friendly_errors():
        app = obj.app()
        if client_id is None:
            rows = [_client_row(c) for c in app.store.list_clients()]
            ledger: list[dict[str, Any]] = []
        else:
            rows = [_client_row(app.billing.client(client_id))]
            ledger = [e.model_dump(mode="json") for e in app.store.ledger(client_id)]
    if as_json:
        emit_json(rows[0] | {"ledger": ledger} if client_id else rows)
        return
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
    if client_id:
        entries = Table("at", "kind", "amount", "held", "balance", "batch", "note")
        for e in ledger:
            entries.add_row(
                e["at"][:19],
                e["kind"],
                str(e["amount"]),
                str(e["held_change"]),
                str(e["balance_after"]),
                e.get("batch_id") or "",
                e.get("note") or "",
            )
        console.print(entries)


def _client_row(client: Client) -> dict[str, Any]:
    row = client.model_dump(mode="json", exclude={"api_key_hashes", "webhook_secret"})
    row["available"] = client.available
    row["api_keys"] = len(client.api_key_hashes)
    return row
