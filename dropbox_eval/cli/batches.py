"""Commands on batches: submit, list, show, poll, emit, cancel, watch."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import click
from rich.table import Table

from ..app import App
from ..errors import EXIT_FAILED, EXIT_REJECTED
from ..models import utcnow
from ..report import status_counts
from . import Context
from .output import age, bar, console, emit_json, friendly_errors, json_option


@click.command()
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--client", "client_id", help="Submit into inbox/<client>/ (fixes the client).")
@json_option
@click.pass_obj
def submit(obj: Context, file: Path, client_id: str | None, as_json: bool) -> None:
    """Take FILE through the inbox once, in the foreground; prints the receipt or error."""
    with friendly_errors():
        app = obj.app()
        target = _place_in_inbox(app, file, client_id)
        outcome = app.inbox.process(target)
    if as_json:
        emit_json(outcome.document)
    else:
        for key, value in outcome.document.items():
            click.echo(f"{key}: {value}")
    if outcome.status == "rejected":
        sys.exit(EXIT_REJECTED)
    if outcome.status != "accepted":  # left in place (busy, unreadable): try again later
        sys.exit(EXIT_FAILED)


def _place_in_inbox(app: App, file: Path, client_id: str | None) -> Path:
    folder = app.inbox.root / client_id if client_id else app.inbox.root
    folder.mkdir(parents=True, exist_ok=True)
    if file.resolve().parent == folder.resolve():
        return file.resolve()
    target = folder / file.name
    if target.exists():
        target = folder / f"{file.stem}.{utcnow():%Y%m%d%H%M%S%f}{file.suffix}"
    tmp = folder / f".{target.name}.copying"
    shutil.copyfile(file, tmp)
    tmp.rename(target)
    return target


@click.command()
@click.option("--status", "status_filter", help="Only batches with this status.")
@json_option
@click.pass_obj
def batches(obj: Context, status_filter: str | None, as_json: bool) -> None:
    """List batches: id, client, status, done/total, age."""
    with friendly_errors():
        rows = obj.app().store.list_batches(
            (lambda r: r["status"] == status_filter) if status_filter else None
        )
    if as_json:
        emit_json(rows)
        return
    table = Table("batch", "client", "ref", "status", "progress", "done", "age")
    for row in rows:
        table.add_row(
            row["batch_id"],
            row["client_id"],
            row.get("batch_ref") or "",
            row["status"],
            bar(row["done"], row["total"]),
            f"{row['done']}/{row['total']}",
            age(row["created_at"]),
        )
    console.print(table)


@click.command()
@click.argument("batch_id")
@json_option
@click.pass_obj
def batch(obj: Context, batch_id: str, as_json: bool) -> None:
    """Show one batch and each task's issue, status and summary."""
    with friendly_errors():
        store = obj.app().store
        record = store.get_batch(batch_id)
        tasks = store.get_tasks(batch_id)
    if as_json:
        data = record.model_dump(mode="json", exclude={"report"})
        data["counts"] = status_counts(tasks, every_status=True)
        data["tasks"] = [t.model_dump(mode="json", exclude={"payload"}) for t in tasks]
        emit_json(data)
        return
    console.print(
        f"batch {record.batch_id}  client {record.client_id}  status "
        f"[bold]{record.status}[/]  {record.done}/{record.total} done  repo "
        f"{record.repo}"
    )
    if record.last_delivery_error:
        console.print(f"last delivery error: {record.last_delivery_error}")
    table = Table("task", "issue", "status", "summary", "url")
    for task in tasks:
        table.add_row(
            task.task_id,
            str(task.issue_number or ""),
            task.status,
            task.result.summary if task.result else "",
            task.issue_url or "",
        )
    console.print(table)


@click.command()
@click.argument("batch_id", required=False)
@json_option
@click.pass_obj
def poll(obj: Context, batch_id: str | None, as_json: bool) -> None:
    """Poll the forge once (every running batch, or BATCH_ID) and store finished results."""
    with friendly_errors():
        app = obj.app()
        app.settings.require_forge()
        rows = app.store.list_batches(
            lambda r: r["status"] == "running" and batch_id in (None, r["batch_id"]), live_only=True
        )
        if batch_id and not rows:
            app.store.get_batch(batch_id)  # unknown -> exit 3; finished -> nothing to poll
        by_repo: dict[str, list[str]] = {}
        for row in rows:
            app.intake.open_issues(str(row["batch_id"]))
            by_repo.setdefault(str(row["repo"]), []).append(str(row["batch_id"]))
        finished: dict[str, list[str]] = {}
        for repo_ids in by_repo.values():  # an explicit poll checks every issue
            finished.update(app.poller.poll_batches(repo_ids, full=True, probe=False))
    if as_json:
        emit_json(finished)
    else:
        for one, tasks in finished.items():
            click.echo(f"{one}: {len(tasks)} task(s) finished {' '.join(tasks)}".rstrip())


@click.command()
@click.argument("batch_id")
@click.option("--force", is_flag=True, help="Send again even if already emitted.")
@json_option
@click.pass_obj
def emit(obj: Context, batch_id: str, force: bool, as_json: bool) -> None:
    """Deliver a finished batch's report (file or callback)."""
    with friendly_errors():
        result = obj.app().delivery.emit(batch_id, force=force)
    if as_json:
        emit_json(result)
    else:
        where = result.get("delivered_to") or f"already emitted at {result.get('emitted_at')}"
        click.echo(f"{batch_id}: {where}")


@click.command()
@click.argument("batch_id")
@json_option
@click.pass_obj
def cancel(obj: Context, batch_id: str, as_json: bool) -> None:
    """Cancel a running batch: close its open issues, keep finished results, emit the report."""
    with friendly_errors():
        app = obj.app()
        batch = app.lifecycle.cancel(batch_id)
    result = {"ok": True, "batch_id": batch_id, "status": batch.status, "charged": batch.charged}
    if as_json:
        emit_json(result)
    else:
        click.echo(
            f"{batch_id}: {batch.status}, charged {batch.charged}; the service emits "
            "the report (or run `dropbox-eval emit`)"
        )


@click.command()
@click.argument("batch_id")
@click.option("--interval", type=float, default=1.0, show_default=True)
@click.pass_obj
def watch(obj: Context, batch_id: str, interval: float) -> None:
    """Follow one batch live until it ends (emitted, cancelled or expired)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with friendly_errors():
        store = obj.app().store
        record = store.get_batch(batch_id)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task(batch_id, total=record.total)
            while True:
                record = store.get_batch(batch_id)
                progress.update(
                    bar, completed=record.done, description=f"{batch_id} {record.status}"
                )
                given_up = record.delivery_attempts and record.next_delivery_at is None
                if record.emitted_at or (record.status != "running" and given_up):
                    break
                time.sleep(interval)
    click.echo(f"{batch_id}: {record.status}, {record.done}/{record.total} done")


COMMANDS = [submit, batches, batch, poll, emit, cancel, watch]
