"""Output shared by every command: tables or `--json`, errors, exit codes.

Exit codes: errors.EXIT_CODES (README "Exit codes"); errors map to them through the one
table, errors.answer_for. An error is one line on stderr, or under `--json` the document
`{"ok": false, "reason", "message"}` on stdout (the API's error shape), with the same exit
code; a full, read-only or refused folder too (errors.storage_error), never a traceback.
Ctrl-C ends any command quietly with 130.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import click
from rich.console import Console

from ..errors import EXIT_INTERRUPTED, DropboxEvalError, answer_for, error_document, storage_errors

# piped output keeps whole ids (rich assumes 80 columns when stdout is not a terminal)
console = Console(width=None if sys.stdout.isatty() else 200)
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print JSON instead of text; an error is {"ok": false, "reason", "message"} on stdout.',
)


def emit_json(data: Any, *, lines: bool = False) -> None:
    """Machine-readable output (`lines`: one compact document per line, for streams)."""
    if lines:
        click.echo(json.dumps(data, sort_keys=True, default=str))
    else:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def problem(reason: str, message: str, **details: Any) -> dict[str, Any]:
    """An error document (the shape of errors.error_document)."""
    return {"ok": False, "reason": reason, "message": message, **details}


def emit_error(document: dict[str, Any], *, as_json: bool) -> None:
    """An error document as one line on stderr, or as JSON on stdout."""
    if as_json:
        emit_json(document)
    else:
        click.echo(f"error: {document['message']}", err=True)


def fail(message: str, code: int, *, as_json: bool = False, reason: str = "failed") -> NoReturn:
    """Report an error (see `emit_error`) and exit with `code`."""
    emit_error(problem(reason, message), as_json=as_json)
    sys.exit(code)


@contextlib.contextmanager
def friendly_errors(as_json: bool = False) -> Iterator[None]:
    """Map the project's errors (and an OSError of a full, read-only or refused folder) to
    their message and documented exit code."""
    try:
        with storage_errors():
            yield
    except DropboxEvalError as exc:
        emit_error(error_document(exc), as_json=as_json)
        sys.exit(answer_for(exc)[1])
    except KeyboardInterrupt:
        if not as_json:
            click.echo("", err=True)
        sys.exit(EXIT_INTERRUPTED)
