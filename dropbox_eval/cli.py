"""The `dropbox-eval` command line.

Exit codes: 0 success; 1 an operation failed (forge or delivery error, demo timed out);
2 usage or configuration error; 3 unknown batch or client; 4 the submitted batch was
rejected; 5 another service already runs on this state folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from .config import Settings, load_settings
from .errors import (
    AlreadyRunning,
    ConfigError,
    DropboxEvalError,
    NotFoundError,
)
from .fileio import write_atomically
from .models import Client, utcnow
from .report import status_counts
from .service import App, Service, build_app, read_status
from .sftp.cli import add_key_command, keys_command, remove_key_command, sftp_command

EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REJECTED, EXIT_RUNNING = 1, 2, 3, 4, 5
# piped output keeps whole ids (rich assumes 80 columns when stdout is not a terminal)
console = Console(width=None if sys.stdout.isatty() else 200)

SETTING_OPTIONS: list[tuple[str, str, Any]] = [
    ("--home", "home", click.Path(path_type=Path)),
    ("--inbox", "inbox", click.Path(path_type=Path)),
    ("--output-dir", "output_dir", click.Path(path_type=Path)),
    ("--state-dir", "state_dir", click.Path(path_type=Path)),
    ("--gitea-url", "gitea_url", str),
    ("--gitea-token", "gitea_token", str),
    ("--owner", "owner", str),
    ("--repo", "repo", str),
    ("--poll-interval", "poll_interval", float),
    ("--task-price", "task_price", int),
]


class Context:
    """Setting overrides from the command line, resolved lazily into Settings."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides

    def settings(self, **more: Any) -> Settings:
        """Environment + command-line overrides."""
        return load_settings(**{**self.overrides, **more})

    def app(self, **more: Any) -> App:
        """The wired components."""
        return build_app(self.settings(**more))


def fail(message: str, code: int) -> NoReturn:
    """Print one line to stderr and exit with `code`."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextlib.contextmanager
def friendly_errors() -> Iterator[None]:
    """Map the project's errors to one line and a documented exit code."""
    try:
        yield
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except NotFoundError as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except AlreadyRunning as exc:
        fail(str(exc), EXIT_RUNNING)
    except DropboxEvalError as exc:  # forge, delivery, store and every other failure
        fail(str(exc), EXIT_FAILED)


def emit_json(data: Any) -> None:
    """Machine-readable output."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _settings_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for flag, name, kind in reversed(SETTING_OPTIONS):
        env = f"SAAS_EVAL_{name.upper()}"
        func = click.option(flag, name, type=kind, default=None,
                            help=f"Overrides {env}.")(func)
    return func


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@_settings_options
@click.pass_context
def main(ctx: click.Context, /, verbose: bool, **overrides: Any) -> None:
    """dropbox-eval: file-drop eval batches -> forge issues -> lane results -> reports."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("urllib3", "watchdog", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ctx.obj = Context(overrides)


# -- service ------------------------------------------------------------------------------

@main.command()
@click.option("--once", is_flag=True, help="Process what is there, poll, emit, exit.")
@click.option("--sandbox", is_flag=True, help="Run the embedded sandbox forge and lane.")
@click.option("--lane-delay", type=float, default=2.0, show_default=True,
              help="With --sandbox: seconds before the simulated lane closes an issue.")
@click.option("--polling", is_flag=True, help="Poll the inbox (for NFS/SMB shares).")
@click.pass_obj
def run(obj: Context, once: bool, sandbox: bool, lane_delay: float, polling: bool) -> None:
    """Run the service: watch the inbox, open issues, poll, emit (until SIGINT/SIGTERM)."""
    with friendly_errors(), _maybe_sandbox(obj, sandbox, lane_delay) as extra:
        settings = obj.settings(**extra)
        settings.require_forge()
        code = Service(build_app(settings), polling=polling or settings.polling).run(once=once)
    sys.exit(code)


@contextlib.contextmanager
def _maybe_sandbox(obj: Context, enabled: bool, lane_delay: float) -> Iterator[dict[str, Any]]:
    if not enabled:
        yield {}
        return
    from .sandbox import SandboxForge

    with SandboxForge(lane_delay=lane_delay) as forge:
        logging.getLogger("dropbox_eval").info("sandbox forge at %s (token %s)", forge.url,
                                               forge.token)
        yield {"gitea_url": forge.url, "gitea_token": forge.token, "owner": forge.user,
               "repo": None}


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True)
@click.pass_obj
def serve(obj: Context, host: str, port: int) -> None:
    """Serve the HTTP API (OpenAPI document at /docs and /openapi.json)."""
    import uvicorn

    from .api import create_api

    with friendly_errors():
        api = create_api(obj.app())
    uvicorn.run(api, host=host, port=port, log_level="info")


@main.command()
@click.option("--port", type=int, default=3000, show_default=True)
@click.option("--lane-delay", type=float, default=5.0, show_default=True,
              help="Seconds before the simulated lane closes an issue (negative: no lane).")
def sandbox(port: int, lane_delay: float) -> None:
    """Run the sandbox forge (Gitea API subset + simulated lane) alone."""
    from .sandbox import SandboxForge

    with SandboxForge(port=port, lane_delay=lane_delay if lane_delay >= 0 else None) as forge:
        click.echo(f"SAAS_EVAL_GITEA_URL={forge.url}")
        click.echo(f"SAAS_EVAL_GITEA_TOKEN={forge.token}")
        click.echo(f"SAAS_EVAL_OWNER={forge.user}")
        click.echo("sandbox forge running; Ctrl-C stops it", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


# -- batches ------------------------------------------------------------------------------

@main.command()
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--client", "client_id", help="Submit into inbox/<client>/ (fixes the client).")
@click.option("--json", "as_json", is_flag=True)
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


@main.command()
@click.option("--status", "status_filter", help="Only batches with this status.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def batches(obj: Context, status_filter: str | None, as_json: bool) -> None:
    """List batches: id, client, status, done/total, age."""
    with friendly_errors():
        rows = obj.app().store.list_batches(
            (lambda r: r["status"] == status_filter) if status_filter else None)
    if as_json:
        emit_json(rows)
        return
    table = Table("batch", "client", "ref", "status", "progress", "done", "age")
    for row in rows:
        table.add_row(row["batch_id"], row["client_id"], row.get("batch_ref") or "",
                      row["status"], _bar(row["done"], row["total"]),
                      f"{row['done']}/{row['total']}", _age(row["created_at"]))
    console.print(table)


def _bar(done: int, total: int, width: int = 10) -> str:
    filled = round(width * done / total) if total else width
    return "#" * filled + "-" * (width - filled)


@main.command()
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True)
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
    console.print(f"batch {record.batch_id}  client {record.client_id}  status "
                  f"[bold]{record.status}[/]  {record.done}/{record.total} done  repo "
                  f"{record.repo}")
    if record.last_delivery_error:
        console.print(f"last delivery error: {record.last_delivery_error}")
    table = Table("task", "issue", "status", "summary", "url")
    for task in tasks:
        table.add_row(task.task_id, str(task.issue_number or ""), task.status,
                      task.result.summary if task.result else "", task.issue_url or "")
    console.print(table)


@main.command()
@click.argument("batch_id", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def poll(obj: Context, batch_id: str | None, as_json: bool) -> None:
    """Poll the forge once (every running batch, or BATCH_ID) and store finished results."""
    with friendly_errors():
        app = obj.app()
        app.settings.require_forge()
        rows = app.store.list_batches(
            lambda r: r["status"] == "running" and batch_id in (None, r["batch_id"]),
            live_only=True)
        if batch_id and not rows:
            app.store.get_batch(batch_id)  # unknown -> exit 3; finished -> nothing to poll
        by_repo: dict[str, list[str]] = {}
        for row in rows:
            app.intake.open_issues(str(row["batch_id"]))
            by_repo.setdefault(str(row["repo"]), []).append(str(row["batch_id"]))
        finished: dict[str, list[str]] = {}
        for repo_ids in by_repo.values():  # an explicit poll checks every issue
            finished.update(app.intake.poll_batches(repo_ids, full=True, probe=False))
    if as_json:
        emit_json(finished)
    else:
        for one, tasks in finished.items():
            click.echo(f"{one}: {len(tasks)} task(s) finished {' '.join(tasks)}".rstrip())


@main.command()
@click.argument("batch_id")
@click.option("--force", is_flag=True, help="Send again even if already emitted.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def emit(obj: Context, batch_id: str, force: bool, as_json: bool) -> None:
    """Deliver a finished batch's report (file or callback)."""
    with friendly_errors():
        result = obj.app().intake.emit(batch_id, force=force)
    if as_json:
        emit_json(result)
    elif result.get("ok"):
        where = result.get("delivered_to") or f"already emitted at {result.get('emitted_at')}"
        click.echo(f"{batch_id}: {where}")
    else:
        click.echo(f"{batch_id}: not finished ({result['done']}/{result['total']} tasks done)")
    if not result.get("ok"):
        sys.exit(EXIT_FAILED)


@main.command()
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def cancel(obj: Context, batch_id: str, as_json: bool) -> None:
    """Cancel a running batch: close its open issues, keep finished results, emit the report."""
    with friendly_errors():
        app = obj.app()
        batch = app.intake.cancel(batch_id)
    result = {"ok": True, "batch_id": batch_id, "status": batch.status, "charged": batch.charged}
    if as_json:
        emit_json(result)
    else:
        click.echo(f"{batch_id}: {batch.status}, charged {batch.charged}; the service emits "
                   "the report (or run `dropbox-eval emit`)")


@main.command()
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
                progress.update(bar, completed=record.done,
                                description=f"{batch_id} {record.status}")
                given_up = record.delivery_attempts and record.next_delivery_at is None
                if record.emitted_at or (record.status != "running" and given_up):
                    break
                time.sleep(interval)
    click.echo(f"{batch_id}: {record.status}, {record.done}/{record.total} done")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(obj: Context, as_json: bool) -> None:
    """Whether the service runs, since when, its last poll and last error."""
    with friendly_errors():
        settings = obj.settings()
        settings.state_path.mkdir(parents=True, exist_ok=True)
        record = read_status(settings.state_path)
        app = build_app(settings, with_forge=False)
        counts: dict[str, int] = {}
        for row in app.store.list_batches():
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        record["batches"] = counts
    if as_json:
        emit_json(record)
        return
    state = "running" if record["running"] else "not running"
    click.echo(f"service: {state} (pid {record.get('pid', '-')}, since "
               f"{record.get('started_at', '-')})")
    click.echo(f"last poll: {record.get('last_poll_at') or '-'}")
    click.echo(f"last error: {record.get('last_error') or '-'}")
    click.echo("batches: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))


# -- clients ------------------------------------------------------------------------------

@main.group()
def clients() -> None:
    """Client accounts and credits."""


@clients.command("add")
@click.argument("client_id")
@click.option("--credits", type=int, default=0, show_default=True)
@click.pass_obj
def clients_add(obj: Context, client_id: str, credits: int) -> None:
    """Create a client account."""
    with friendly_errors():
        client = obj.app().billing.add_client(client_id, credits)
    click.echo(f"{client.client_id}: balance {client.balance}")
    click.echo(f"webhook secret: {client.webhook_secret}")


@clients.command("fund")
@click.argument("client_id")
@click.argument("credits", type=int)
@click.pass_obj
def clients_fund(obj: Context, client_id: str, credits: int) -> None:
    """Add CREDITS to a client's balance (a ledger entry)."""
    with friendly_errors():
        client = obj.app().billing.fund(client_id, credits)
    click.echo(f"{client.client_id}: balance {client.balance}")


@clients.command("rotate-secret")
@click.argument("client_id")
@click.pass_obj
def clients_rotate_secret(obj: Context, client_id: str) -> None:
    """Replace the client's webhook signing secret and print the new one."""
    with friendly_errors():
        click.echo(obj.app().billing.rotate_secret(client_id))


@clients.command("api-key")
@click.argument("client_id")
@click.pass_obj
def clients_api_key(obj: Context, client_id: str) -> None:
    """Issue an API key for the HTTP API (printed once; only its hash is stored)."""
    with friendly_errors():
        click.echo(obj.app().billing.new_api_key(client_id))


@clients.command("show")
@click.argument("client_id", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def clients_show(obj: Context, client_id: str | None, as_json: bool) -> None:
    """Show all clients, or one client with its ledger."""
    with friendly_errors():
        app = obj.app()
        if client_id is None:
            rows = [_client_row(c) for c in app.store.list_clients()]
            ledger: list[dict[str, Any]] = []
        else:
            rows = [_client_row(app.billing.client(client_id))]
            ledger = [e.model_dump(mode="json") for e in app.store.ledger(client_id)]
    if as_json:
        emit_json(rows[0] | {"ledger": ledger} if client_id else rows)
        return
    table = Table("client", "balance", "held", "available", "since")
    for row in rows:
        table.add_row(row["client_id"], str(row["balance"]), str(row["held"]),
                      str(row["available"]), row["created_at"][:19])
    console.print(table)
    if client_id:
        entries = Table("at", "kind", "amount", "held", "balance", "batch", "note")
        for e in ledger:
            entries.add_row(e["at"][:19], e["kind"], str(e["amount"]), str(e["held_change"]),
                            str(e["balance_after"]), e.get("batch_id") or "", e.get("note") or "")
        console.print(entries)


main.add_command(sftp_command)
for _command in (add_key_command, keys_command, remove_key_command):
    clients.add_command(_command)


def _client_row(client: Client) -> dict[str, Any]:
    row = client.model_dump(mode="json", exclude={"api_key_hashes", "webhook_secret"})
    row["available"] = client.available
    row["api_keys"] = len(client.api_key_hashes)
    return row


# -- demo ---------------------------------------------------------------------------------

DEMO_BATCH = {
    "batch_ref": "demo-1",
    "tasks": [
        {"task_id": "t1", "title": "Check the login page renders",
         "body": "Open /login and confirm the form is shown.",
         "acceptance": ["form visible", "no console errors"]},
        {"task_id": "t2", "title": "Check the signup validation",
         "body": "Submit an empty signup form. lane:fail",
         "acceptance": ["errors shown for every field"]},
        {"task_id": "t3", "title": "Check the password reset mail",
         "body": "Request a reset and read the mail.", "acceptance": ["mail arrives"]},
    ],
}


@main.command()
@click.option("--lane-delay", type=float, default=1.0, show_default=True)
@click.option("--timeout", type=float, default=60.0, show_default=True)
@click.pass_obj
def demo(obj: Context, lane_delay: float, timeout: float) -> None:
    """The whole flow in this folder on the embedded sandbox forge; prints the report."""
    from .sandbox import SandboxForge

    with friendly_errors(), SandboxForge(lane_delay=lane_delay) as forge:
        settings = obj.settings(gitea_url=forge.url, gitea_token=forge.token, owner=forge.user,
                                repo=None, poll_interval=0.5, quiet_period=0.2)
        app = build_app(settings)
        client = app.store.get_client("demo")
        if client is None:
            app.billing.add_client("demo", 100)
        elif client.available < len(DEMO_BATCH["tasks"]) * settings.task_price:
            app.billing.fund("demo", 100, note="demo top-up")
        batch_ref = f"demo-{utcnow():%Y%m%d%H%M%S%f}"
        drop = app.inbox.root / "demo" / f"{batch_ref}.json"
        drop.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(drop, json.dumps({**DEMO_BATCH, "batch_ref": batch_ref}, indent=2))
        click.echo(f"dropped {drop}")
        report = _run_until_report(app, batch_ref, timeout)
    if report is None:
        fail(f"no report within {timeout:.0f}s; see `dropbox-eval status`", EXIT_FAILED)
    click.echo(f"report: {report}")
    click.echo(report.read_text(encoding="utf-8"))


def _run_until_report(app: App, batch_ref: str, timeout: float) -> Path | None:
    service = Service(app)
    thread = threading.Thread(target=service.run, name="service", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    found: Path | None = None
    with console.status("waiting for the lane...") as spinner:
        while time.monotonic() < deadline and found is None:
            time.sleep(0.2)
            batch_id = app.store.find_batch("demo", batch_ref=batch_ref)
            if batch_id:
                batch = app.store.get_batch(batch_id)
                spinner.update(f"batch {batch_id}: {batch.done}/{batch.total} done, "
                               f"{batch.status}")
                path = app.settings.outbox_path / f"{batch_id}.json"
                found = path if path.exists() else None
    service.stop()
    thread.join(timeout=10)
    return found


def _age(created_at: str) -> str:
    seconds = int((utcnow() - datetime.fromisoformat(created_at)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
