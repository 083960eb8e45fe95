"""Commands on batches: submit, list, show, poll, emit, cancel, watch."""

from __future__ import annotations

import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..app import App
from ..errors import EXIT_FAILED, EXIT_REJECTED, InvalidArgument
from ..models import ID_PATTERN, BatchRecord, BatchStatus, TaskRecord, is_valid_id, utcnow
from ..names import reserved_reason
from ..report import status_counts
from ..web.health import service_running
from . import Context
from .output import (
    ENDED_EARLY,
    age,
    console,
    emit_json,
    fail,
    friendly_errors,
    json_option,
    progress,
)

PAGE = 50  # `batches` without --limit


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
        _print_document(outcome.document)
    if outcome.status == "rejected":
        sys.exit(EXIT_REJECTED)
    if outcome.status != "accepted":  # left in place (busy, unreadable): try again later
        sys.exit(EXIT_FAILED)


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


def _place_in_inbox(app: App, file: Path, client_id: str | None) -> Path:
    if client_id is not None and not is_valid_id(client_id):
        raise InvalidArgument(f"--client {client_id!r} must match {ID_PATTERN}")
    if client_id is not None and (reserved := reserved_reason(client_id)) is not None:
        raise InvalidArgument(f"--client: {reserved}")
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
    help=f"The newest N batches by creation time, newest first [default: {PAGE}].",
)
@click.option(
    "--all", "show_all", is_flag=True, help="Every batch, oldest created first (not with --limit)."
)
@json_option
@click.pass_obj
def batches(
    obj: Context,
    status_filter: str | None,
    client_id: str | None,
    limit: int | None,
    show_all: bool,
    as_json: bool,
) -> None:
    """List the newest batches by creation time, newest first (running or not): id, client,
    status, progress, age (reads, writes nothing). The cost follows the page, not the
    history; `--all` reads the whole history and lists it oldest first."""
    if show_all and limit is not None:
        raise click.UsageError("--all lists every batch: leave out --limit (or drop --all)")
    with friendly_errors():
        store = obj.store()
        if show_all:
            rows = store.list_batches(
                lambda r: (
                    (status_filter in (None, r["status"])) and (client_id in (None, r["client_id"]))
                )
            )
        else:
            rows = store.page_batches(
                client_id=client_id, status=status_filter, limit=limit or PAGE
            )
        for row in rows:
            if row["status"] in ENDED_EARLY:
                row["lane_done"] = lane_done(store.get_tasks(row["batch_id"]))
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
            *progress(row),
            age(row["created_at"]),
        )
    console.print(table)


def _problems(record: BatchRecord) -> list[str]:
    """The lines about what went wrong: last errors, attempts so far and the next one."""
    lines = []
    if record.failure or record.last_error:
        lines.append(f"last error: {record.failure or record.last_error}")
    if record.attempts or record.next_attempt_at:
        lines.append(
            f"attempts: {record.attempts} failed in a row  "
            f"next attempt: {_when(record.next_attempt_at)}"
        )
    if record.last_delivery_error:
        lines.append(f"last delivery error: {record.last_delivery_error}")
    if record.delivery_attempts:
        given_up = "- (given up; `emit --force` re-sends)"
        upcoming = _when(record.next_delivery_at) if record.next_delivery_at else given_up
        lines.append(f"delivery attempts: {record.delivery_attempts}  next delivery: {upcoming}")
    return lines


def _when(moment: datetime | None) -> str:
    """A stored time as the table shows it (UTC, to the second), or `-`."""
    return moment.isoformat()[:19] if moment else "-"


def lane_done(tasks: list[TaskRecord]) -> int:
    """Tasks the lane finished (the rest of an early-ended batch was cancelled/expired)."""
    return sum(1 for t in tasks if t.status.is_lane_verdict)


@click.command()
@click.argument("batch_id")
@json_option
@click.pass_obj
def batch(obj: Context, batch_id: str, as_json: bool) -> None:
    """Show one batch and each task's issue, status and summary."""
    with friendly_errors():
        store = obj.store()
        record = store.get_batch(batch_id)
        tasks = store.get_tasks(batch_id)
    if as_json:
        data = record.model_dump(mode="json", exclude={"report"})
        data["counts"] = status_counts(tasks, every_status=True)
        data["tasks"] = [t.model_dump(mode="json", exclude={"payload"}) for t in tasks]
        emit_json(data)
        return
    row = record.model_dump(mode="json") | {"lane_done": lane_done(tasks)}
    console.print(
        f"batch {record.batch_id}  client {record.client_id}  status "
        f"[bold]{record.status}[/]  {' '.join(progress(row))}  repo {record.repo}"
    )
    for line in _problems(record):
        console.print(line, markup=False)
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
        return
    table = Table("batch", "finished now", "tasks")
    for one, tasks in finished.items():
        table.add_row(one, str(len(tasks)), " ".join(tasks))
    console.print(table)


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
@click.option("--interval", type=float, default=1.0, show_default=True)
@click.pass_obj
def watch(obj: Context, batch_id: str, interval: float) -> None:
    """Follow one batch until it ends, or until the service stops (exit 1); Ctrl-C: 130."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with friendly_errors():
        store = obj.store()
        record = store.get_batch(batch_id)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=console, transient=True) as shown:
            line = shown.add_task(batch_id, total=record.total)
            said = ""
            while True:
                record = store.get_batch(batch_id)
                shown.update(line, completed=record.done, description=f"{batch_id} {record.status}")
                news = f"{batch_id}: {record.status}, {record.done}/{record.total}"
                if not console.is_terminal and news != said:  # piped: one line per change
                    click.echo(news)
                    said = news
                if _ended(record) or not service_running(store.state_dir):
                    break
                time.sleep(interval)
        row = record.model_dump(mode="json") | {"lane_done": lane_done(store.get_tasks(batch_id))}
    done = progress(row)[1] + ("" if record.status in ENDED_EARLY else " done")
    click.echo(f"{batch_id}: {record.status}, {done}")
    if not _ended(record):
        fail("the service is not running (see `dropbox-eval status`); stopped watching", 1)


def _ended(record: BatchRecord) -> bool:
    """Delivered, or ended with its delivery given up."""
    given_up = record.delivery_attempts > 0 and record.next_delivery_at is None
    return bool(record.emitted_at) or (record.status != "running" and given_up)


COMMANDS = [submit, batches, batch, poll, emit, cancel, watch]
