"""`dropbox-eval schema NAME` and `dropbox-eval validate FILE...`: what a client checks
before uploading (README "Checking a file before uploading it")."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import EXIT_FAILED
from . import Context
from .output import emit_json, friendly_errors, json_option


@click.command()
@click.argument("name", type=click.Choice(["batch", "receipt", "error", "report"]))
@json_option
def schema(name: str, as_json: bool) -> None:
    """Print the JSON Schema (draft 2020-12) of the batch file, receipt, error file or report.

    The schema this version ships, generated from its models (JSON with or without --json).
    """
    from ..schemas import NAMES, shipped

    assert name in NAMES and as_json in (True, False)
    click.echo(shipped(name), nl=False)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--client",
    "client_id",
    help="Check as dropped into inbox/<client>/ (client_id may then be left out); "
    "without it, as dropped at the top of the inbox.",
)
@json_option
@click.pass_obj
def validate(obj: Context, files: tuple[Path, ...], client_id: str | None, as_json: bool) -> None:
    """Check batch files as the inbox would: exit 1 with one `FILE: message` line per problem.

    The inbox's own parser, limits and messages; exit 0 when every file would be accepted.
    Needs no service, forge or state; the client's credits and the callback host's address
    are checked only when the file is dropped.
    """
    from ..inbox.validation import check_file

    with friendly_errors(as_json):
        settings = obj.settings()
        verdicts = [check_file(path, settings, client_id) for path in files]
    failed = any(v.error is not None or v.unread is not None for v in verdicts)
    if as_json:
        emit_json({"ok": not failed, "files": [v.document() for v in verdicts]})
    else:
        for verdict in verdicts:
            for line in verdict.problems() or [verdict.summary()]:
                click.echo(line)
    if failed:
        sys.exit(EXIT_FAILED)


COMMANDS = [schema, validate]
