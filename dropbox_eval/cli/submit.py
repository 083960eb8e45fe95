"""`dropbox-eval submit FILE`: one drop, with its receipt or error document.

Beside a running service the file is handed over, never raced for: it is renamed into the
inbox (which the service reads at once) and `submit` waits for the receipt or error file
the service files beside it, then prints exactly that. Without a service it takes the file
in itself, in the foreground. If the service stops before filing the file, `submit` takes
it in; if the service is slower than `--timeout`, the file stays in the inbox (it will be
filed) and `submit` says so and exits 1.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..config import Settings
from ..errors import EXIT_FAILED, EXIT_REJECTED, DropboxEvalError, InvalidArgument
from ..inbox import Inbox, handover
from ..intake.pause import Pause
from ..models import ID_PATTERN, is_valid_id
from ..store.servicestate import service_running
from ..util.names import reserved_reason
from . import FOLDERS, FORGE, Context, uses
from .output import console, emit_json, fail, friendly_errors, json_option

LOOK_SECONDS = 0.05


@click.command()
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--client", "client_id", help="Submit into inbox/<client>/ (fixes the client).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Beside a running service: seconds to wait for the receipt it files.",
)
@json_option
@uses(*FOLDERS, *FORGE, "task_price")
@click.pass_obj
def submit(obj: Context, file: Path, client_id: str | None, timeout: float, as_json: bool) -> None:
    """Drop FILE into the inbox once and print its receipt or error document (exit 4 when
    rejected). A running service takes it in; without one, this command does."""
    with friendly_errors(as_json):
        settings = obj.settings()
        folder = _folder(settings, client_id)
        obj.store()  # the state must be there before a file is handed over (NoState)
        try:
            drop = handover.hand_over(file, folder, settings.inbox_path)
        except OSError as exc:
            raise InvalidArgument(f"cannot drop {file} into {folder}: {exc}") from None
        filed = _filed(obj, settings, drop, timeout)
    if filed is None:
        fail(
            f"the service has not filed {drop.path} within {timeout:g} s; the file stays in the "
            "inbox and will be taken: its receipt appears in accepted/ (see `dropbox-eval "
            "status`)",
            EXIT_FAILED,
            as_json=as_json,
            reason="not_filed_yet",
        )
    outcome, document = filed
    if as_json:
        emit_json(document)
    else:
        _print_document(document)
    if outcome == "rejected":
        sys.exit(EXIT_REJECTED)


def _folder(settings: Settings, client_id: str | None) -> Path:
    if client_id is not None and not is_valid_id(client_id):
        raise InvalidArgument(f"--client {client_id!r} must match {ID_PATTERN}")
    if client_id is not None and (reserved := reserved_reason(client_id)) is not None:
        raise InvalidArgument(f"--client: {reserved}")
    return settings.inbox_path / client_id if client_id else settings.inbox_path


def _filed(
    obj: Context, settings: Settings, drop: handover.Drop, timeout: float
) -> tuple[str, dict[str, Any]] | None:
    """The service's filing of the drop, or this process's own when no service runs."""
    deadline = time.monotonic() + timeout
    inbox: Inbox | None = None
    paused = Pause(settings.state_path, flags=obj.store().flags())
    while True:
        found = drop.filed()
        if found is not None:
            return found
        if (since := paused.since()) is not None:  # nobody takes it in before `resume`
            raise DropboxEvalError(
                f"intake is paused since {since}: {drop.path} waits in the inbox and is "
                "taken after `dropbox-eval resume`"
            )
        if not service_running(settings.state_path):
            inbox = inbox or obj.app().inbox
            outcome = inbox.process(drop.path)  # left alone while another process has it
            if outcome.status in ("accepted", "rejected"):
                return outcome.status, outcome.document
            if outcome.document.get("reason") not in ("busy", "vanished"):
                why = outcome.document.get("message") or outcome.document.get("reason")
                raise DropboxEvalError(f"{drop.path} is left in the inbox: {why}")
        if time.monotonic() >= deadline:
            return None
        time.sleep(LOOK_SECONDS)


def _print_document(document: dict[str, Any]) -> None:
    """A receipt or error document as `key  value` lines (lists one item per line)."""
    table = Table("field", "value", show_header=False, box=None)
    for key, value in document.items():
        if isinstance(value, list):
            value = "\n".join(_plain(item) for item in value) or "-"
        table.add_row(key, _plain(value))
    console.print(table)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items())
    return "-" if value is None else str(value)


COMMANDS = [submit]
