"""`dropbox-eval demo`: the whole flow on the embedded sandbox forge."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from ..errors import EXIT_FAILED, DropboxEvalError
from ..models import utcnow
from ..service import Service
from ..store.servicestate import service_running
from ..util.fileio import SHARED_MODE, write_atomically
from ..views import Views
from . import FOLDERS, Context, uses
from .output import console, emit_json, fail, friendly_errors, json_option
from .service import lane_option, sandbox_options

DEMO_SETTLE_SECONDS = 4.0  # twice the sandbox lane's default SANDBOX_COMMENT_LAG
DEMO_BATCH = {
    "batch_ref": "demo-1",
    "tasks": [
        {
            "task_id": "t1",
            "title": "Check the login page renders",
            "body": "Open /login and confirm the form is shown.",
            "acceptance": ["form visible", "no console errors"],
        },
        {
            "task_id": "t2",
            "title": "Check the signup validation",
            "body": "Submit an empty signup form. lane:fail",
            "acceptance": ["errors shown for every field"],
        },
        {
            "task_id": "t3",
            "title": "Check the password reset mail",
            "body": "Request a reset and read the mail.",
            "acceptance": ["mail arrives"],
        },
    ],
}


@click.command()
@click.option(
    "--lane-delay",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds before the simulated lane closes an issue.",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the report before giving up (exit 1).",
)
@lane_option(
    "pulls",
    "The lane's protocol: `pulls` opens a PR per task and merges it (the `lane:fail` task's "
    "PR is abandoned); `labels` only labels, comments and closes.",
)
@json_option
@uses(*FOLDERS, "task_price")
@click.pass_obj
def demo(obj: Context, lane_delay: float, timeout: float, lane: str, as_json: bool) -> None:
    """The whole flow in this folder on the embedded sandbox forge; prints the report."""
    from ..sandbox import SandboxForge

    with friendly_errors(as_json):
        forge_run = SandboxForge.from_env(lane_delay=lane_delay, options=sandbox_options(lane))
    with friendly_errors(as_json), forge_run as forge:
        app, service = obj.service(
            create=True,
            gitea_url=forge.url,
            gitea_token=forge.token,
            owner=forge.user,
            repo=None,
            poll_interval=0.5,
            quiet_period=0.2,
            settle_seconds=DEMO_SETTLE_SECONDS,
            **_own_home_if_taken(obj),
        )
        settings = app.settings
        client = app.store.get_client("demo")
        if client is None:
            app.billing.add_client("demo", 100)
        elif client.available < len(DEMO_BATCH["tasks"]) * settings.task_price:
            app.billing.fund("demo", 100, note="demo top-up")
        batch_ref = f"demo-{utcnow():%Y%m%d%H%M%S%f}"
        drop = app.inbox.root / "demo" / f"{batch_ref}.json"
        drop.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(
            drop,
            json.dumps({**DEMO_BATCH, "batch_ref": batch_ref}, indent=2),
            mode=SHARED_MODE,
        )
        say(f"dropped {drop}", as_json)
        report = _run_until_report(service, batch_ref, timeout, as_json)
    if report is None:
        fail(
            f"no report within {timeout:.0f}s; see `dropbox-eval status`",
            EXIT_FAILED,
            as_json=as_json,
            reason="timed_out",
        )
    if as_json:
        emit_json({"ok": True, "report_path": str(report), "report": read_json(report)})
        return
    click.echo(f"report: {report}")
    click.echo(report.read_text(encoding="utf-8"))


def say(line: str, as_json: bool) -> None:
    """A line for the person watching: stdout, or stderr when stdout carries JSON."""
    click.echo(line, err=as_json)


def read_json(path: Path) -> Any:
    """The report as JSON."""
    return json.loads(path.read_text(encoding="utf-8"))


def _own_home_if_taken(obj: Context) -> dict[str, Any]:
    """Beside a running service the demo uses a temporary home of its own (never the
    service's folders, whose lock it could not take)."""
    if not service_running(obj.settings().state_path):
        return {}
    home = Path(tempfile.mkdtemp(prefix="dropbox-eval-demo-"))
    click.echo(
        f"a service runs on this state folder: the demo runs in {home} "
        f"(kept for you to look at; `rm -r {home}` removes it)",
        err=True,
    )
    return {
        "home": home,
        "inbox": home / "inbox",
        "output_dir": home / "outbox",
        "state_dir": home / "state",
    }


def _run_until_report(
    service: Service, batch_ref: str, timeout: float, as_json: bool
) -> Path | None:
    errors: list[DropboxEvalError] = []

    def run() -> None:
        try:
            service.run()
        except DropboxEvalError as exc:  # shown by the main thread, not as a thread traceback
            errors.append(exc)

    thread = threading.Thread(target=run, name="service", daemon=True)
    thread.start()
    views = Views(service.store)
    deadline = time.monotonic() + timeout
    found: Path | None = None
    with console.status("waiting for the lane...") as spinner:
        if as_json:
            spinner.stop()
        while time.monotonic() < deadline and found is None:
            if errors:
                raise errors[0]
            time.sleep(0.2)
            batch_id = views.find("demo", batch_ref)
            if batch_id:
                view = views.batch_summary(batch_id)
                spinner.update(f"batch {batch_id}: {view['status']}, {view['progress']['text']}")
                path = service.settings.outbox_path / f"{batch_id}.json"
                found = path if path.exists() else None
    service.stop()
    thread.join(timeout=10)
    return found


COMMANDS = [demo]
