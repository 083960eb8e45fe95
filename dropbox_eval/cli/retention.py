"""`dropbox-eval delete ID` and `dropbox-eval prune`: an ended batch removed for good, one
at a time or past the retention, keeping its tombstone and every ledger entry
(ops/retention.py)."""

from __future__ import annotations

import click

from ..ops.retention import Retention
from . import FOLDERS, Context, uses
from .audit import audited
from .output import emit_json, friendly_errors, json_option


def _retention(obj: Context) -> Retention:
    app = obj.app(with_forge=False)
    return Retention(app.store, app.billing, app.settings)


@click.command()
@click.argument("batch_id")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def delete(obj: Context, batch_id: str, as_json: bool) -> None:
    """Delete an ended batch: its report, task details, receipt and drop go; a tombstone
    (id, client, status, dates, task counts, charge) and the ledger stay. A running batch
    is refused (exit 1): cancel it first."""
    with friendly_errors(as_json), audited(obj, "delete", batch_id):
        tombstone = _retention(obj).delete(batch_id)
    if as_json:
        emit_json(tombstone)
        return
    click.echo(
        f"{batch_id}: deleted ({tombstone['status']}, {tombstone['counts']['total']} tasks, "
        f"charged {tombstone['charged']}); its tombstone stays"
    )


@click.command()
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(0),
    help="Days: prune what ended (or was filed) before then [default: SAAS_EVAL_RETENTION_DAYS].",
)
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def prune(obj: Context, older_than: float | None, dry_run: bool, as_json: bool) -> None:
    """Delete the batches that ended before the retention (keeping tombstones and the
    ledger: balances do not move), and the rejected drops, error files and cancel
    requests filed before it."""
    action = "prune-dry-run" if dry_run else "prune"
    with friendly_errors(as_json), audited(obj, action, "-", older_than=older_than) as more:
        pruned = _retention(obj).prune(older_than, dry_run=dry_run)
        more.update(batches=len(pruned.batches), files=pruned.files, failed=len(pruned.failed))
    if as_json:
        emit_json(pruned.as_dict())
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{verb} {len(pruned.batches)} batches and {pruned.files} filed drops "
        f"(ended or filed before {pruned.cutoff})"
    )
    for batch_id, why in pruned.failed.items():
        click.echo(f"{batch_id}: kept: {why}", err=True)


COMMANDS = [delete, prune]
