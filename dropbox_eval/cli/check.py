"""`dropbox-eval check`: the state check (statecheck.py) from the command line."""

from __future__ import annotations

import sys

import click

from ..app import build_app
from ..billing import Billing
from ..errors import EXIT_FAILED, EXIT_OK
from ..servicestate import already_running, service_running
from ..statecheck import StateCheck
from . import FOLDERS, Context, uses
from .output import emit_json, friendly_errors, json_option


@click.command()
@click.option(
    "--repair",
    is_flag=True,
    help="Repair what can be repaired (refused while the service runs: it repairs at start "
    "and at every full reconciliation).",
)
@json_option
@uses(*FOLDERS, "task_price")
@click.pass_obj
def check(obj: Context, repair: bool, as_json: bool) -> None:
    """Check that the index, the batch records and the ledger agree (read-only unless
    --repair). Exit 0 when nothing is left that a start cannot repair, 1 otherwise."""
    with friendly_errors(as_json):
        settings = obj.settings()
        if repair:
            if service_running(settings.state_path):
                raise already_running(settings.state_path)
            statecheck = build_app(settings, with_forge=False).statecheck
        else:
            store = obj.store()
            statecheck = StateCheck(
                store, Billing(store, settings.task_price), settings.delivery_max_attempts
            )
        findings = statecheck.run(repair=repair)
    unrepairable = [f for f in findings if not f.repairable]
    if as_json:
        emit_json(
            {
                "ok": not unrepairable,
                "findings": [f.as_dict() for f in findings],
                "repaired": repair,
            }
        )
    else:
        for finding in findings:
            if not finding.repairable:
                action = "cannot be repaired: an operator must look"
            else:
                verb = "repaired" if finding.repaired else "the next start repairs it"
                action = f"{verb}: {finding.repair}"
            click.echo(f"{finding.subject}: {finding.problem}\n  {action}")
        if not findings:
            click.echo("state: consistent (index, records and ledger agree)")
    sys.exit(EXIT_FAILED if unrepairable else EXIT_OK)


COMMANDS = [check]
