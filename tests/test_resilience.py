"""Crashes, forge outages, receiver outages and concurrent writers lose nothing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PATIENCE, database_env, read_json, serving, start_receiver, tasks, wait_for
from helpers import closed_port, drop, finish_issues

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.billing.accounts import Billing
from dropbox_eval.config import Settings, load_settings
from dropbox_eval.sandbox import SandboxForge, SimulatedLane
from dropbox_eval.service import Service
from dropbox_eval.store.engine import TinyDBStore


@pytest.fixture
def running(app: App) -> Iterator[Service]:
    """The service loop in a background thread (real watchdog observer)."""
    with serving(app) as service:
        yield service


def _service_env(tmp_path: Path, forge: SandboxForge) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env.update(
        SAAS_EVAL_HOME=str(tmp_path),
        SAAS_EVAL_GITEA_URL=forge.url,
        SAAS_EVAL_GITEA_TOKEN=forge.token,
        SAAS_EVAL_OWNER=forge.user,
        SAAS_EVAL_POLL_INTERVAL="0.3",
        SAAS_EVAL_QUIET_PERIOD="0.1",
    )
    env.update(database_env())
    return env


@pytest.mark.slow
def test_sigkill_during_intake_never_duplicates_or_loses(
    tmp_path: Path, forge: SandboxForge
) -> None:
    seed = int(os.environ.get("KILL_SEED", time.time()))
    rng = random.Random(seed)
    settings = load_settings(home=tmp_path)
    Billing(TinyDBStore(settings.state_path), 1).add_client("acme", 1000)
    drop(settings.inbox_path, "big.json", {"batch_ref": "big", "tasks": tasks(500)}, "acme")
    forge.set_delay(0.02)  # a real forge takes milliseconds per create
    env = _service_env(tmp_path, forge)
    command = [sys.executable, "-m", "dropbox_eval", "run"]
    kills = []
    for _ in range(10):
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        moment = rng.uniform(0.7, 1.6)
        time.sleep(moment)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=PATIENCE)
        created = sum(len(forge.issues(forge.user, r)) for r in _repos(forge))
        kills.append((round(moment, 2), created))
    forge.set_delay(0)
    lane = SimulatedLane(forge.state, delay=0.0, interval=0.05)
    lane.start()
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        # 500 issues to create and settle on a possibly loaded machine: three patiences
        assert wait_for(lambda: any(settings.outbox_path.glob("*.json")), 3 * PATIENCE), (
            seed,
            kills,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=PATIENCE)
        lane.stop()
    assert proc.returncode == 0, stderr
    repos = _repos(forge)
    assert len(repos) == 1, (seed, kills, repos)
    issues = forge.issues(forge.user, repos[0])
    assert len(issues) == 500, (seed, kills)
    assert len({i["title"] for i in issues}) == 500
    reports = list(settings.outbox_path.glob("*.json"))
    assert len(reports) == 1
    assert read_json(reports[0])["counts"] == {"total": 500, "passed": 500, "failed": 0}
    store = TinyDBStore(settings.state_path)
    assert [row.status for row in store.list_batches()] == ["emitted"]
    charges = [e for e in store.ledger("acme") if e.kind == "charge"]
    assert [c.amount for c in charges] == [-500]
    assert store.get_client("acme").balance == 500  # type: ignore[union-attr]


def _repos(forge: SandboxForge) -> list[str]:
    return sorted(name for _owner, name in list(forge.state.repos) if name.startswith("eval-acme"))


@pytest.mark.slow
def test_forge_outage_of_30_seconds_during_polling(settings: Settings, forge: SandboxForge) -> None:
    # retries every 0-2 s (full jitter): a 30 s outage takes more than the default 20
    app = build_app(settings.model_copy(update={"max_attempts": 200}))
    app.billing.add_client("acme", 100)
    app.intake.submit_batch("acme", tasks(3))
    forge.fail_for(30, 503)
    lane = SimulatedLane(forge.state, delay=0.0, interval=0.05)
    lane.start()
    service = service_for(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: service.status.get("last_error") is not None)
        assert "503" in service.status["last_error"]
        # the outage itself lasts 30 s of the wait
        assert wait_for(lambda: any(app.settings.outbox_path.glob("*.json")), 30 + PATIENCE)
    finally:
        lane.stop()
        service.stop()
        thread.join(timeout=PATIENCE)
    report = read_json(next(app.settings.outbox_path.glob("*.json")))
    assert report["counts"]["passed"] == 3


def test_callback_down_then_up_delivers_once_with_same_id(
    tmp_path: Path, forge: SandboxForge, settings: Settings
) -> None:
    port = closed_port()
    quick = settings.model_copy(update={"delivery_retry_base": 0.3})
    app = build_app(quick)
    app.billing.add_client("acme", 10)
    url = f"http://127.0.0.1:{port}/hook"
    batch_id = app.intake.submit_batch("acme", tasks(1), callback_url=url)["batch_id"]
    finish_issues(forge, f"{forge.user}/eval-acme-{batch_id}")
    service = service_for(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    server = None
    try:
        assert wait_for(lambda: app.store.get_batch(batch_id).delivery_attempts >= 1)
        kept = app.settings.outbox_path / "undelivered" / f"{batch_id}.json"
        assert kept.exists()
        receiver, server = start_receiver(port)
        assert wait_for(lambda: app.store.get_batch(batch_id).status == "emitted")
    finally:
        service.stop()
        thread.join(timeout=PATIENCE)
        if server is not None:
            server.shutdown()
            server.server_close()
    assert len(receiver.received) == 1
    headers, body = receiver.received[0]
    assert headers["webhook-id"] == f"msg_{batch_id}"
    assert json.loads(body)["batch_id"] == batch_id
    assert not kept.exists()


FUND_100 = """
import sys
from dropbox_eval.cli import main
for _ in range(100):
    main(["--home", sys.argv[1], "clients", "fund", "acme", "1"], standalone_mode=False)
"""


def test_funding_from_another_process_while_service_charges(
    app: App, funded: str, running: Service
) -> None:
    home = str(app.settings.home)
    proc = subprocess.Popen(
        [sys.executable, "-c", FUND_100, home],
        env={**os.environ, **database_env()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for i in range(8):
        drop(
            app.settings.inbox_path, f"b{i}.json", {"batch_ref": f"b{i}", "tasks": tasks(2)}, funded
        )
        time.sleep(0.05)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    assert wait_for(lambda: len(app.store.list_batches()) == 8)
    client = app.billing.client(funded)
    assert (client.balance, client.held) == (100 + 100, 8 * 2 * 2)
    ledger = app.store.ledger(funded)
    assert sum(e.amount for e in ledger) == client.balance
    assert sum(e.held_change for e in ledger) == client.held
    assert len([e for e in ledger if e.kind == "fund"]) == 101


def test_wrong_token_stops_work_with_a_message_and_service_stays_up(
    tmp_path: Path, forge: SandboxForge, settings: Settings
) -> None:
    app = build_app(settings.model_copy(update={"gitea_token": "expired"}))
    app.billing.add_client("acme", 10)
    service = service_for(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        drop(app.settings.inbox_path, "a.json", {"tasks": tasks(1)}, "acme")
        assert wait_for(lambda: "SAAS_EVAL_GITEA_TOKEN" in str(service.status.get("last_error")))
        assert thread.is_alive()
        rows = app.store.list_batches()
        assert [r.status for r in rows] == ["running"]  # kept, resumes once the token works
    finally:
        service.stop()
        thread.join(timeout=PATIENCE)
