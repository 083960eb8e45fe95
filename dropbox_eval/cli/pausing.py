"""`dropbox-eval pause` / `resume`: hold intake and forge writes (pause.py)."""

from __future__ import annotations

import click

from ..intake.pause import Pause
from . import STATE, Context, uses
from .audit import audited
from .output import emit_json, friendly_errors, json_option


@click.command()
@json_option
@uses(*STATE)
@click.pass_obj
def pause(obj: Context, as_json: bool) -> None:
    """Hold intake: files wait in the inbox, forge writes stop; polling and delivery go on.
    No receipt or error file is written and no issue is created, commented or closed
    (cancels are stored, deadlines wait); it survives a restart; `resume` ends it."""
    with friendly_errors(as_json), audited(obj, "pause", "-"):
        store = obj.store()
        state = Pause(store.state_dir, flags=store.flags())
        state.pause(by="cli")
        view = state.view()
    if as_json:
        emit_json({"ok": True, **view})
    else:
        click.echo(f"paused since {view['paused_since']}: files wait in the inbox")


@click.command()
@json_option
@uses(*STATE)
@click.pass_obj
def resume(obj: Context, as_json: bool) -> None:
    """End the pause: the service takes the waiting files and resumes forge writes."""
    with friendly_errors(as_json), audited(obj, "resume", "-") as detail:
        store = obj.store()
        state = Pause(store.state_dir, flags=store.flags())
        ended = state.resume()
        detail["was_paused"] = ended is not None
    if as_json:
        emit_json({"ok": True, **state.view(), "was_paused_since": (ended or {}).get("since")})
    elif ended is None:
        click.echo("not paused: nothing to resume")
    else:
        click.echo(
            f"resumed (paused since {ended.get('since')}): the service takes the waiting files"
        )


COMMANDS = [pause, resume]
