"""Output shared by every command: tables or `--json`, one-line errors, exit codes.

Exit codes: errors.EXIT_CODES (documented in docs/operating.md); errors map to them through
the one table, errors.answer_for. Ctrl-C ends any command quietly with 130.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any, NoReturn

import click
from rich.console import Console

from ..errors import EXIT_INTERRUPTED, DropboxEvalError, answer_for
from ..models import BatchStatus, utcnow

# piped output keeps whole ids (rich assumes 80 columns when stdout is not a terminal)
console = Console(width=None if sys.stdout.isatty() else 200)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def fail(message: str, code: int) -> NoReturn:
    """Print one line to stderr and exit with `code`."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextlib.contextmanager
def friendly_errors() -> Iterator[None]:
    """Map the project's errors to one line and their documented exit code."""
    try:
        yield
    except DropboxEvalError as exc:
        fail(str(exc), answer_for(exc)[1])
    except KeyboardInterrupt:
        click.echo("", err=True)
        sys.exit(EXIT_INTERRUPTED)


def emit_json(data: Any) -> None:
    """Machine-readable output."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def bar(done: int, total: int, width: int = 10) -> str:
    """A progress bar in plain characters."""
    filled = round(width * done / total) if total else width
    return "#" * filled + "-" * (width - filled)


ENDED_EARLY = (BatchStatus.CANCELLED, BatchStatus.EXPIRED, BatchStatus.FAILED)


def progress(row: dict[str, Any]) -> tuple[str, str]:
    """(bar, done) columns of a batch row: a batch that ended early shows how it ended,
    never a full bar (its unfinished tasks were cancelled, not done)."""
    if row["status"] in ENDED_EARLY:
        return f"({row['status']})", f"{row.get('lane_done', '?')}/{row['total']} by the lane"
    return bar(row["done"], row["total"]), f"{row['done']}/{row['total']}"


def age(created_at: str) -> str:
    """How long ago an ISO timestamp was, in the largest whole unit."""
    seconds = int((utcnow() - datetime.fromisoformat(created_at)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
