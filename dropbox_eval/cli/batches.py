"""Commands on batches: list, show, poll, emit, cancel, watch (`submit`: submit.py).

What they show comes from the read model (views): the same fields, progress and timestamps
as the API and the operator's page.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.table import Table

from ..models import BatchStatus
from ..store.servicestate import service_running
from ..util.timestamps import age
from ..views import Progress, Views
from . import FOLDERS, FORGE, STATE, Context, uses
from .audit import audited
from .output import console, emit_json, fail, friendly_errors, json_option

PAGE = 50  # `batches` without --limit


@click.command()
@click.option(
    "--status",
    "status_filter",
    type=click.Choice([str(s) for s in BatchStatus]),
    help="Only batches with this status.",
)
@click.option("--client", "client_id", help="Only this client's batches.")
@click.option(
    "--limit",
    type=click.IntRange(1),
    help=f"The first N batches: live ones newest first, then ended ones [default: {PAGE}].",
)
@click.option(
    "--all", "show_all", is_flag=True, help="Every batch, oldest created first (not with --limit)."
)
@json_option
@uses(*STATE)
@click.pass_obj
def batches(
    obj: Context,
    status_filter: str | None,
    client_id: str | None,
    limit: int | None,
    show_all: bool,
    as_json: bool,
) -> None:
    """List batches, the live first, then the most recently ended: id, client, status,
    progress, age.

    Live batches come newest created first; the reading writes nothing, and its cost
    follows the page, not the history. `--all` reads the whole history and lists it
    oldest created first."""
    with friendly_errors(as_json):
        if show_all and limit is not None:
            raise click.UsageError("--all lists every batch: leave out --limit (or drop --all)")
        rows = Views(obj.store()).batches(
            client_id=client_id, status=status_filter, limit=limit or PAGE, every=show_all
        )
    if as_json:
        emit_json(rows)
        return
    table = Table("batch", "client", "ref", "status", "progress", "done", "age")
    for row in rows:
        progress = Progress.from_view(row)
        table.add_row(
            row["batch_id"],
            row["client_id"],
            row.get("batch_ref") or "",
            row["status"],
            progress.bar(),
            progress.text(),
            age(row["created_at"]),
        )
    console.print(table)


def problems(view: dict[str, Any]) -> list[str]:
    """The lines about what went wrong: last errors, attempts so far and the next one."""
    lines = []
    if view["failure"] or view["last_error"]:
        lines.append(f"last error: {view['failure'] or view['last_error']}")
    if view["attempts"] or view["next_attempt_at"]:
        lines.append(
            f"attempts: {view['attempts']} failed in a row  "
            f"next attempt: {view['next_attempt_at'] or '-'}"
        )
    if view["last_delivery_error"]:
        lines.append(f"last delivery error: {view['last_delivery_error']}")
    if view["delivery_attempts"]:
        given_up = "- (given up; `emit --force` re-sends)"
        upcoming = view["next_delivery_at"] or given_up
        lines.append(f"delivery attempts: {view['delivery_attempts']}  next delivery: {upcoming}")
    return lines


@click.command()
@click.argument("batch_id")
@json_option
@uses(*STATE)
@click.pass_obj
def batch(obj: Context, batch_id: str, as_json: bool) -> None:
    """Show one batch (progress, attempts, last error, delivery) and each task's issue,
    status and summary."""
    with friendly_errors(as_json):
        view = Views(obj.store()).batch(batch_id)
    if as_json:
        emit_json(view)
        return
    progress = Progress.from_view(view)
    console.print(
        f"batch {view['batch_id']}  client {view['client_id']}  status "
        f"[bold]{view['status']}[/]  {progress.bar()} {progress.text()}  repo {view['repo']}"
    )
    for line in problems(view):
        console.print(line, markup=False)
    for label in ("retry_of", "retried_by"):  # retry.py: the links between a batch and its retry
        if view[label]:
            console.print(f"{label.replace('_', ' ')} {view[label]}", markup=False)
    for key, value in (view.get("metadata") or {}).items():
        console.print(f"metadata {key}: {value}", markup=False)
    table = Table("task", "issue", "status", "summary", "url")
    for task in view["tasks"]:
        table.add_row(
            task["task_id"],
            str(task["issue_number"] or ""),
            "settling" if task["settling"] else task["status"],
            task["summary"] or "",
            task["issue_url"] or "",
        )
    console.print(table)


@click.command()
@click.argument("batch_id", required=False)
@json_option
@uses(*FOLDERS, *FORGE)
@click.pass_obj
def poll(obj: Context, batch_id: str | None, as_json: bool) -> None:
    """Poll the forge once (every running batch, or BATCH_ID) and store finished results."""
    with friendly_errors(as_json):
        app = obj.app()
        app.settings.require_forge()
        rows = app.store.list_batches(live_only=True, status=BatchStatus.RUNNING, batch_id=batch_id)
        if batch_id and not rows:
            app.store.get_batch(batch_id)  # unknown -> exit 3; finished -> nothing to poll
        by_repo: dict[str, list[str]] = {}
        for row in rows:
            app.intake.open_issues(row.batch_id)
            by_repo.setdefault(row.repo, []).append(row.batch_id)
        finished: dict[str, list[str]] = {}
        for repo_ids in by_repo.values():  # an explicit poll checks every issue
            finished.update(app.poller.poll_batches(repo_ids, full=True, probe=False))
    if as_json:
        emit_json(finished)
        return
    table = Table("batch", "finished now", "tasks")
    for one, tasks in finished.items():
        table.add_row(one, str(len(tasks)), " ".join(tasks))
    console.print(table)


@click.command()
@click.argument("batch_id")
@click.option("--force", is_flag=True, help="Send again even if already emitted.")
@json_option
@uses(*FOLDERS)
@click.pass_obj
def emit(obj: Context, batch_id: str, force: bool, as_json: bool) -> None:
    """Deliver a finished batch's report (file or callback)."""
    with friendly_errors(as_json), audited(obj, "emit", batch_id, force=force or None):
        result = obj.app().delivery.emit(batch_id, force=force)
    if as_json:
        emit_json(result)
    else:
        where = result.get("delivered_to") or f"already emitted at {result.get('emitted_at')}"
        click.echo(f"{batch_id}: {where}")


@click.command()
@click.argument("batch_id")
@json_option
@uses(*FOLDERS, *FORGE)
@click.pass_obj
def cancel(obj: Context, batch_id: str, as_json: bool) -> None:
    """Cancel a running batch: close its open issues, keep finished results, emit the report."""
    with friendly_errors(as_json), audited(obj, "cancel", batch_id):
        app = obj.app()
        batch = app.lifecycle.cancel(batch_id)
    stored = batch.status == BatchStatus.RUNNING  # no forge here, or it failed half-way
    result = {
        "ok": True,
        "batch_id": batch_id,
        "status": batch.status,
        "charged": batch.charged,
        "cancel_requested": True,
    }
    if as_json:
        emit_json(result)
    elif stored:
        click.echo(
            f"{batch_id}: cancel stored; the service closes its open issues and emits "
            "the report at its next cycle"
        )
    else:
        click.echo(
            f"{batch_id}: {batch.status}, charged {batch.charged}; the service emits "
            "the report (or run `dropbox-eval emit`)"
        )


@click.command()
@click.argument("batch_id")
@click.option(
    "--interval", type=float, default=1.0, show_default=True, help="Seconds between looks."
)
@json_option
@uses(*STATE)
@click.pass_obj
def watch(obj: Context, batch_id: str, interval: float, as_json: bool) -> None:
    """Follow one batch until it ends (exit 0), or until the service stops (exit 1); Ctrl-C:
    130. Piped, a line per change; with --json, a JSON document per change."""
    from rich import progress as rich

    with friendly_errors(as_json):
        store = obj.store()
        views = Views(store)
        view = views.batch_summary(batch_id)
        columns = (
            rich.TextColumn("{task.description}"),
            rich.BarColumn(),
            rich.MofNCompleteColumn(),
        )
        live = console.is_terminal and not as_json
        with rich.Progress(*columns, console=console, transient=True, disable=not live) as shown:
            line = shown.add_task(batch_id, total=view["total"])
            said = ""
            while True:
                view = views.batch_summary(batch_id)
                news = _news(view)
                shown.update(line, completed=view["progress"]["done"], description=news)
                if not live and news != said:  # piped: one line per change
                    emit_json(view, lines=True) if as_json else click.echo(news)
                    said = news
                if _ended(view) or not service_running(store.state_dir):
                    break
                time.sleep(interval)
        if _ended(view):
            view = views.batch(batch_id)  # what the lane finished, for an early end
    if not as_json:
        click.echo(_news(view))
    if not _ended(view):
        fail(
            "the service is not running (see `dropbox-eval status`); stopped watching",
            1,
            as_json=as_json,
            reason="not_running",
        )


def _news(view: dict[str, Any]) -> str:
    """`<id>: running, 1/3 done, 2 settling`."""
    return f"{view['batch_id']}: {view['status']}, {view['progress']['text']}"


def _ended(view: dict[str, Any]) -> bool:
    """Delivered, or ended with its delivery given up."""
    return bool(view["delivery"] in ("delivered", "given_up"))


COMMANDS = [batches, batch, poll, emit, cancel, watch]
