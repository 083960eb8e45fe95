"""The state check: a kill between two files of one change is found and repaired at the
next start; `dropbox-eval check` reports without writing, and fails on what it cannot
repair; `status` and `/readyz` show what the service could not repair."""

from __future__ import annotations

import json
from pathlib import Path

import requests
from conftest import Cli, settings_on
from crashworld import World, assert_invariants
from filelock import FileLock

from dropbox_eval.app import build_app, service_for
from dropbox_eval.models import BatchStatus
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web


def _stranded(tmp_path: Path, forge: SandboxForge) -> World:
    """A batch whose closing was killed between its record and its index row."""
    world = World(tmp_path, forge)
    world.fund()
    world.drop()
    world.run_once()
    world.close_issues()
    assert world.run_once("close:2")  # killed right after the record's write (after the report's)
    assert world.kills == [f"crash point: close write 2 ({world.batch().batch_id}.json)"]
    return world


def test_a_kill_between_the_closing_writes_strands_nothing(
    tmp_path: Path, forge: SandboxForge
) -> None:
    world = _stranded(tmp_path, forge)
    store = world.store()
    row = world.batch()
    record = store.get_batch(row.batch_id)
    # what the stranded batch looked like: the record finished, the cache still running
    assert record.status == BatchStatus.COMPLETED and record.charged == 3
    assert row.status == BatchStatus.RUNNING and record.delivery_attempts == 0
    assert store.get_client("acme").held == 3  # type: ignore[union-attr]
    assert not list(world.settings.outbox_path.glob("*.json"))

    checked = Cli(tmp_path, forge)("check", "--json")
    assert checked.exit_code == 0, checked.output  # repairable: the next start repairs it
    findings = json.loads(checked.stdout)["findings"]
    problems = sorted(f["problem"] for f in findings)
    assert problems[0] == "completed but 3 credits still held", problems
    assert problems[1].startswith("index row disagrees with the record (status 'running' ->")
    assert all(f["repairable"] and not f["repaired"] for f in findings)
    assert world.batch().status == BatchStatus.RUNNING  # check alone writes nothing

    world.run_once()  # the next start repairs, then delivers
    assert_invariants(world)
    assert Cli(tmp_path, forge)("check").stdout.startswith("state: consistent")


def test_an_intake_killed_before_it_was_committed_leaves_nothing_behind(
    tmp_path: Path, forge: SandboxForge
) -> None:
    world = World(tmp_path, forge)
    world.fund()
    world.drop()
    assert world.run_once("intake:2")  # the tasks and the record, not the index
    store = world.store()
    assert store.list_batches(live_only=True) == [] and len(store.stored_batch_ids()) == 1
    orphan = store.stored_batch_ids()[0]
    world.run_once()
    world.close_issues()
    world.run_once()
    assert_invariants(world)  # one batch for the drop, not two
    assert orphan not in {r.batch_id for r in world.store().list_batches()}
    assert not (world.settings.state_path / "tasks" / f"{orphan}.json").exists()


def test_check_fails_on_what_it_cannot_repair_and_the_service_says_so(
    tmp_path: Path, forge: SandboxForge
) -> None:
    world = World(tmp_path, forge)
    world.fund()
    world.drop()
    world.run_once()
    batch_id = world.batch().batch_id
    (world.settings.state_path / "batches" / f"{batch_id}.json").unlink()  # a lost record

    cli = Cli(tmp_path, forge)
    checked = cli("check")
    assert checked.exit_code == 1
    assert f"batch {batch_id}: the index names it but its record is gone" in checked.stdout
    assert "cannot be repaired" in checked.stdout

    app = build_app(settings_on(forge, tmp_path))
    service_for(app).check_state()  # what every start runs
    status = json.loads(cli("status", "--json").stdout)
    assert [p["subject"] for p in status["state_problems"]] == [f"batch {batch_id}"]
    server = BackgroundServer(create_web(app.web, lambda: {}))
    try:
        answer = requests.get(f"{server.start()}/readyz", timeout=30)
    finally:
        server.stop()
    assert answer.status_code == 503
    assert answer.json()["checks"]["state"].startswith("1 state problem(s)")


def test_check_repair_is_refused_beside_a_running_service_and_works_alone(
    tmp_path: Path, forge: SandboxForge
) -> None:
    world = _stranded(tmp_path, forge)
    cli = Cli(tmp_path, forge)
    with FileLock(str(world.settings.state_path / "service.lock")):  # a service runs
        refused = cli("check", "--repair")
    assert refused.exit_code == 5 and "another dropbox-eval run" in refused.output
    assert world.batch().status == BatchStatus.RUNNING
    repaired = cli("check", "--repair", "--json")
    assert repaired.exit_code == 0, repaired.output
    assert all(f["repaired"] for f in json.loads(repaired.stdout)["findings"])
    assert world.batch().status == BatchStatus.COMPLETED
    assert world.store().get_client("acme").held == 0  # type: ignore[union-attr]
    again = json.loads(cli("check", "--json").stdout)
    assert again == {"attention": [], "findings": [], "ok": True, "repaired": False}
