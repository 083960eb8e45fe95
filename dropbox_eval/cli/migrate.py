"""`dropbox-eval migrate`: create or update the PostgreSQL schema (store/pg/migrate.py)."""

from __future__ import annotations

import click

from ..errors import ConfigError
from . import Context
from .output import emit_json, friendly_errors, json_option


@click.command()
@json_option
@click.pass_obj
def migrate(obj: Context, as_json: bool) -> None:
    """Create or update the PostgreSQL schema (SAAS_EVAL_DATABASE_URL); `run` does too.

    Each version is applied once, under a lock. Exit 0 when it is up to date; a database
    newer than this version of dropbox-eval is refused."""
    with friendly_errors(as_json):
        url = obj.settings().database_url
        if not url:
            raise ConfigError(
                "SAAS_EVAL_DATABASE_URL is not set: the schema is PostgreSQL's "
                "(without it the store is TinyDB files, which need no migration)"
            )
        from ..store.pg.migrate import latest_version
        from ..store.pg.migrate import migrate as apply

        applied = apply(url)
    if as_json:
        emit_json({"ok": True, "applied": applied, "version": latest_version()})
    elif applied:
        click.echo(f"applied {', '.join(applied)}: schema at version {latest_version()}")
    else:
        click.echo(f"up to date: schema at version {latest_version()}")


COMMANDS = [migrate]
