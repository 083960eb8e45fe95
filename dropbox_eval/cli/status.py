"""`dropbox-eval status`: what a running service says of itself (a light module: no forge
client, no web framework, no SSH server are loaded for it)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import EXIT_NOT_RUNNING, EXIT_OK
from ..ops.sameconfig import differences, published
from ..sftp.status import sftp_status
from ..store.nodes import default_node_id
from ..util import storage
from ..util.names import is_reserved_client_id, rename_advice
from ..views import Views
from . import STATE, Context, uses
from .output import emit_json, friendly_errors, json_option


@click.command()
@json_option
@uses(*STATE)
@click.pass_obj
def status(obj: Context, as_json: bool) -> None:
    """Whether the service runs, since when, its last poll and last error (writes nothing).
    Exit 0 when it runs and 3 when it does not (as `systemctl status`)."""
    with friendly_errors(as_json):
        views = Views(obj.store(writable=True))
        record = views.service()
        record["batches"] = views.count()  # the index alone, whatever the history
        settings = obj.settings()
        this_node = settings.node_id or default_node_id(settings.state_path)
        record["node_id"] = this_node
        record["nodes"] = [  # nodes sharing a database (none on one machine)
            row.as_dict() for row in views.store.node(this_node, settings.lease_seconds).nodes()
        ]
        record["sftp"] = sftp_status(views.store.state_dir)
        record["settings_differ"] = differences(
            published(obj.settings()), record.get("settings") or {} if record["running"] else {}
        )
        record["storage"] = [str(problem) for problem in storage.problems(obj.settings())]
        record["reserved_clients"] = [  # stored before their id was reserved (names.py)
            {"client_id": c["client_id"], "available": c["available"]}
            for c in views.clients()
            if is_reserved_client_id(c["client_id"])
        ]
    if as_json:
        emit_json(record)
    else:
        _print_status(record)
    sys.exit(EXIT_OK if record["running"] else EXIT_NOT_RUNNING)


def _print_status(record: dict[str, Any]) -> None:
    if record["running"]:
        click.echo(f"service: running (pid {record.get('pid')}, since {record.get('started_at')})")
        click.echo(f"last poll: {record.get('last_poll_at') or '-'}")
    else:
        click.echo(f"service: not running (stopped {record.get('stopped_at') or '-'})")
    if record["paused"]:
        click.echo(
            f"intake: paused since {record['paused_since']} by {record['paused_by'] or '-'} "
            "(files wait in the inbox; `dropbox-eval resume` ends it)"
        )
    click.echo(f"last error: {record.get('last_error') or '-'}")
    for name, worker in sorted((record.get("workers") or {}).items()):  # stopped: one failed
        click.echo(_worker_line(name, worker))
    for problem in record["storage"]:  # the state folder's own makes `status` fail
        click.echo(f"storage: {problem} (it resumes by itself once space or writes return)")
    problems = record.get("state_problems") or []
    click.echo(
        f"state: {len(problems)} problem(s) to look at (`dropbox-eval check`)"
        if problems
        else "state: no problem found at the last check"
    )
    counts = record["batches"]
    click.echo("batches: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    for node in record["nodes"]:
        click.echo(_node_line(node, node["node_id"] == record["node_id"]))
    sftp = record["sftp"]
    where = f"on {sftp.get('host')}:{sftp.get('port')} (pid {sftp.get('pid')})"
    state = f"running {where}" if sftp["running"] else "not running"
    click.echo(f"sftp: {state}; host key {sftp.get('host_key') or '- (created on first start)'}")
    for line in record["settings_differ"]:
        click.echo(f"warning: this command's settings differ from the service's: {line}")
    if record["settings_differ"]:
        click.echo(
            "warning: run commands with the service's environment file: "
            "`dropbox-eval --env-file /etc/dropbox-eval/dropbox-eval.env ...` (or set "
            "SAAS_EVAL_ENV_FILE)"
        )
    for reserved in record["reserved_clients"]:
        click.echo(f"warning: {rename_advice(reserved['client_id'], reserved['available'])}")


def _worker_line(name: str, worker: dict[str, Any]) -> str:
    """`worker forge-worker: restarting since ..., 2 restart(s), last error: ...`."""
    words = f"worker {name}: {worker['state']} since {worker['since']}"
    if worker.get("detail"):
        words += f" ({worker['detail']})"
    if worker.get("restarts"):
        words += f", {worker['restarts']} restart(s)"
    if worker.get("last_error"):
        words += f", last error: {worker['last_error']}"
    return words


COMMANDS = [status]


def _node_line(node: dict[str, Any], this: bool) -> str:
    """`node NAME (this one) on HOST pid P, vX: up, heartbeat 3 s ago; holds poll 2`."""
    holds = ", ".join(f"{kind} {count}" for kind, count in sorted(node["holds"].items()))
    return (
        f"node {node['node_id']}{' (this one)' if this else ''} on {node['host']} pid "
        f"{node['pid']}, v{node['version']}: {node['state']}, heartbeat "
        f"{node['heartbeat_age']:.0f} s ago; holds {holds or 'nothing'}"
    )
