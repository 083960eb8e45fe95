"""`dropbox-eval audit`: the operators' actions (store/audit.py), and `audited`, which every
command that changes something wraps its action in, so that it is recorded with its result.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..errors import DropboxEvalError, answer_for, storage_error
from ..store.audit import local_user, record_action
from ..util.printable import printable
from ..views import Views
from . import STATE, Context, uses
from .output import console, emit_json, friendly_errors, json_option

log = logging.getLogger("dropbox_eval")


@contextlib.contextmanager
def audited(obj: Context, action: str, target: str, **detail: Any) -> Iterator[dict[str, Any]]:
    """Record `action` on `target` in the audit log as the block ends, as the local user:
    `ok`, or the reason code of the error the block raised (which goes on). The block may
    add to the yielded dict: it goes into the entry's detail (a key id issued, ...)."""
    more: dict[str, Any] = {}
    try:
        yield more
    except DropboxEvalError as exc:
        _record(obj, action, target, answer_for(exc)[2], {**detail, **more})
        raise
    except OSError as exc:
        storage = storage_error(exc)
        _record(obj, action, target, answer_for(storage)[2] if storage else "error", detail)
        raise
    _record(obj, action, target, "ok", {**detail, **more})


def _record(obj: Context, action: str, target: str, result: str, detail: dict[str, Any]) -> None:
    """One entry. A log that cannot be written is a warning after an action that happened
    (not its failure); after one that failed, its own error line says enough (a read-only
    state refuses both)."""
    try:
        settings = obj.settings()
        if settings.database_url:  # the database's audit_log, which `audit` reads there
            obj.store().record_action(
                action, target, actor=local_user(), via="cli", result=result, **detail
            )
            return
        record_action(  # the folder's file, never creating a state that is not there
            settings.state_path,
            action,
            target,
            actor=local_user(),
            via="cli",
            result=result,
            **detail,
        )
    except (DropboxEvalError, OSError) as exc:
        level = logging.WARNING if result == "ok" else logging.DEBUG
        log.log(level, "audit log: %s on %s (%s) not recorded: %s", action, target, result, exc)


@click.command("audit")
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Newest N actions."
)
@click.option("--all", "show_all", is_flag=True, help="Every action recorded.")
@json_option
@uses(*STATE)
@click.pass_obj
def audit(obj: Context, limit: int, show_all: bool, as_json: bool) -> None:
    """Show the operators' actions, oldest first: when, who, through what, what, on what,
    and the result (reads the state, writes nothing)."""
    with friendly_errors(as_json):
        entries = Views(obj.store()).audit(None if show_all else limit)
    if as_json:
        emit_json(entries)
        return
    table = Table("at", "who", "via", "action", "target", "result", "detail")
    for entry in entries:
        who = entry["actor"] + (f" ({entry['key_id']})" if entry.get("key_id") else "")
        detail = " ".join(f"{k}={v}" for k, v in sorted(entry.get("detail", {}).items()))
        cells = (entry["at"], who, entry["via"], entry["action"], entry["target"])
        table.add_row(
            # never markup, and a client's text (a batch id it asked to delete) is escaped:
            # it must not move the operator's cursor or rewrite the terminal
            *(Text(printable(cell)) for cell in (*cells, entry["result"], detail)),
            style=None if entry["result"] == "ok" else "red",
        )
    console.print(table)


COMMANDS = [audit]
