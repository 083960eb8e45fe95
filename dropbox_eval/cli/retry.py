"""`dropbox-eval retry BATCH`: a failed or expired batch's failed and aborted tasks, again,
as a new batch (retry.py)."""

from __future__ import annotations

import click

from . import FOLDERS, FORGE, Context, uses
from .audit import audited
from .output import emit_json, friendly_errors, json_option


@click.command()
@click.argument("batch_id")
@json_option
@uses(*FOLDERS, *FORGE, "task_price")
@click.pass_obj
def retry(obj: Context, batch_id: str, as_json: bool) -> None:
    """Retry a failed or expired batch: a new batch with its failed and aborted tasks.
    Those are the tasks that ended failed, aborted, expired or missing; the new batch is
    linked both ways (retry_of, retried_by), holds credits as usual and has its own report."""
    with friendly_errors(as_json), audited(obj, "retry", batch_id) as detail:
        app = obj.app()
        receipt = app.retries.retry(batch_id)
        detail["retried_by"] = receipt["batch_id"]
        paused = app.pause.since()
    if as_json:
        emit_json(receipt)
        return
    numbers = [i["issue_number"] for i in receipt["issues"]]
    opened = sum(1 for n in numbers if n is not None)
    rest = (
        "after `dropbox-eval resume` (intake is paused)" if paused else "the service opens the rest"
    )
    click.echo(
        f"{batch_id}: retried by batch {receipt['batch_id']} ({receipt['task_count']} tasks, "
        f"held {receipt['held']}; {opened} of {len(numbers)} issues opened; {rest})"
    )


COMMANDS = [retry]
