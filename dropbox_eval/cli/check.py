"""`dropbox-eval check`: the state check (statecheck.py) and what needs a person
(attention.py) from the command line: what a cron job or a monitor runs."""

from __future__ import annotations

import sys

import click

from ..billing.accounts import Billing
from ..errors import EXIT_FAILED, EXIT_OK
from ..ops.attention import Attention, needs_a_person
from ..ops.statecheck import Finding, StateCheck
from ..store.servicestate import already_running, service_running
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
    --repair). Then list what needs a person, one line each with the command that resolves
    it: a report whose delivery was given up, a batch held past its deadline, a worker of
    the running service down (or one that failed and stopped it), an inbox folder missing
    for over ten minutes, a state problem no start can repair. Exit 0 when there is none
    (the service resolves the rest alone), 1 otherwise."""
    with friendly_errors(as_json):
        settings = obj.settings()
        if repair:
            if service_running(settings.state_path):
                raise already_running(settings.state_path)
            statecheck = obj.app(with_forge=False).statecheck
        else:
            store = obj.store(writable=True)
            statecheck = StateCheck(
                store, Billing(store, settings.task_price), settings.delivery_max_attempts
            )
        findings = statecheck.run(repair=repair)
        attention = needs_a_person(statecheck.store, settings, findings)
    if as_json:
        emit_json(
            {
                "ok": not attention,
                "findings": [f.as_dict() for f in findings],
                "attention": [item.as_dict() for item in attention],
                "repaired": repair,
            }
        )
    else:
        _print(findings, attention)
    sys.exit(EXIT_FAILED if attention else EXIT_OK)


def _print(findings: list[Finding], attention: list[Attention]) -> None:
    for finding in findings:
        if not finding.repairable:
            action = "cannot be repaired: an operator must look"
        else:
            verb = "repaired" if finding.repaired else "the next start repairs it"
            action = f"{verb}: {finding.repair}"
        click.echo(f"{finding.subject}: {finding.problem}\n  {action}")
    if not findings:
        click.echo("state: consistent (index, records and ledger agree)")
    for item in attention:
        if item.kind != "state_problem":  # printed above, with the finding
            click.echo(item.line())
    if not attention:
        click.echo("nothing needs a person")


COMMANDS = [check]
