"""Nothing stops silently, against a real `dropbox-eval run --http-port 0`
child: an inbox that is missing (a share not mounted) is waited out and named by `/readyz`;
a worker whose loop raises is restarted, shown and counted; one that cannot stay up stops
the service with a non-zero exit, for systemd to restart it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import PATIENCE, metric, readiness, wait_for
from test_pause import Running, _drop, _receipt
from test_retry import Home

from dropbox_eval.app import App
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web
from dropbox_eval.workers.supervisor import FAULT_ENV, RESTART_LIMIT


@pytest.fixture
def home(tmp_path: Path, forge: SandboxForge) -> Home:
    return Home(tmp_path / "home", forge)


def _readyz(service: Running) -> tuple[int, dict[str, str]]:
    code, body = readiness(service.url)
    return code, body["checks"]


def _worker(home: Home, name: str) -> dict[str, Any]:
    """The worker's state in `status --json` ({} before the service wrote it)."""
    worker: dict[str, Any] = home.json("status").get("workers", {}).get(name, {})
    return worker


def _inbox_check_is(service: Running, wanted: str) -> bool:
    code, checks = _readyz(service)
    return checks["inbox"] == wanted and (code == 200) == (wanted == "ok")


def test_an_inbox_not_mounted_yet_is_waited_for_and_taken_once_there(home: Home) -> None:
    share = home.home.parent / "share" / "inbox"  # the mount point's folder, not there yet
    home.home.mkdir()
    (home.home / "inbox").symlink_to(share)
    added = home.run("clients", "add", "acme", "--credits", "20")
    assert added.returncode == 0, added.stderr  # a dangling inbox is no reason to fail
    assert not share.exists()  # nor made through the symlink
    service = Running(home)
    try:
        assert wait_for(lambda: _inbox_check_is(service, f"inbox {share}: missing"))
        assert wait_for(lambda: metric(service.url, "dropbox_eval_inbox_watched") == 0)
        assert _metric(service, "dropbox_eval_worker_up", "inbox-worker") == 1  # waiting
        waiting = _worker(home, "inbox-worker")
        assert waiting["state"] == "waiting" and waiting["detail"] == f"inbox {share}: missing"
        assert f"worker inbox-worker: waiting since {waiting['since']}" in home.run("status").stdout
        share.mkdir(parents=True)  # mounted
        _drop(home, "first.json")
        assert wait_for(lambda: _receipt(home, "first.json").exists())
        assert wait_for(lambda: _inbox_check_is(service, "ok"))
        assert wait_for(lambda: metric(service.url, "dropbox_eval_inbox_watched") == 1)
        shutil.rmtree(share)  # removed, then made again
        assert wait_for(lambda: _inbox_check_is(service, f"inbox {share}: missing"))
        share.mkdir()
        _drop(home, "second.json")
        assert wait_for(lambda: _receipt(home, "second.json").exists())
        assert wait_for(lambda: _worker(home, "inbox-worker").get("state") == "running")
    finally:
        service.stop()
    log = "".join(service.lines)
    assert "Traceback" not in log
    assert "is missing (a share not mounted yet?): waiting for it" in log
    assert "is there again: taking its files" in log


def _metric(service: Running, name: str, worker: str) -> float | None:
    return metric(service.url, f'{name}{{worker="{worker}"}}')


def test_a_worker_whose_loop_raises_is_restarted_shown_and_counted(home: Home) -> None:
    assert home.run("clients", "add", "acme", "--credits", "20").returncode == 0
    service = Running(home, {FAULT_ENV: "forge-worker:2"})
    try:
        assert wait_for(lambda: _worker(home, "forge-worker").get("restarts") == 2)
        assert wait_for(lambda: _worker(home, "forge-worker").get("state") == "running")
        forge_worker = _worker(home, "forge-worker")
        assert "InjectedFault: injected fault" in forge_worker["last_error"]
        assert _metric(service, "dropbox_eval_worker_restarts_total", "forge-worker") == 2
        assert _metric(service, "dropbox_eval_worker_restarts_total", "inbox-worker") == 0
        assert _metric(service, "dropbox_eval_worker_up", "forge-worker") == 1
        status = home.run("status").stdout
        assert "worker forge-worker: running since" in status and "2 restart(s)" in status
        _drop(home, "after.json")  # the restarted worker does its work
        assert wait_for(lambda: _receipt(home, "after.json").exists())
        assert wait_for(lambda: _readyz(service)[0] == 200)
    finally:
        service.stop()
    log = "".join(service.lines)
    assert "worker forge-worker failed" in log
    assert log.count("Traceback") == 1  # the same cause again: counted, not repeated
    for delay in (1, 2):  # yet each failure has its line, with its error
        assert f"worker forge-worker: restarting in {delay} s after InjectedFault: " in log


@pytest.mark.slow
def test_a_worker_that_cannot_stay_up_stops_the_service_non_zero(home: Home) -> None:
    assert home.run("clients", "add", "acme", "--credits", "20").returncode == 0
    service = Running(home, {FAULT_ENV: "delivery-worker:always"})

    def down_in_readyz() -> bool:
        code, checks = _readyz(service)
        return code == 503 and checks["workers"].startswith("delivery-worker restarting")

    assert wait_for(down_in_readyz)  # the backoff doubles: 1 + 2 + 4 + 8 + 16 s
    assert service.process.wait(timeout=PATIENCE * 2) == 1
    log = "".join(service.lines)
    assert f"worker delivery-worker failed {RESTART_LIMIT + 1} times within 5 minutes" in log
    status = json.loads(home.run("status", "--json").stdout)
    assert status["running"] is False
    assert status["workers"]["delivery-worker"]["state"] == "failed"
    assert status["workers"]["delivery-worker"]["restarts"] == RESTART_LIMIT
    assert f"worker delivery-worker failed {RESTART_LIMIT + 1} times" in status["last_error"]
    shown = home.run("status").stdout  # the worker that stopped it, until the next start
    assert "service: not running" in shown and "last error: " + status["last_error"] in shown
    assert "worker delivery-worker: failed since" in shown
    check = home.json("check", code=1)
    assert [(item["kind"], item["worker"]) for item in check["attention"]] == [
        ("worker_down", "delivery-worker")
    ]
    assert "systemctl restart dropbox-eval" in check["attention"][0]["action"]
    assert home.run("run", "--once").returncode == 0  # a new start rewrites the record
    assert home.json("check")["attention"] == []
    assert "worker " not in home.run("status").stdout


def test_an_inbox_whose_worker_is_down_is_not_watched(app: App) -> None:
    """`/readyz` never says the inbox is watched while its worker restarts or failed."""
    worker = {"restarts": 3, "last_error": "boom", "detail": None, "since": "-"}
    status = {"workers": {"inbox-worker": worker | {"state": "restarting"}}}
    server = BackgroundServer(create_web(app.web, lambda: status))
    try:
        answer = requests.get(f"{server.start()}/readyz", timeout=PATIENCE)
    finally:
        server.stop()
    assert answer.status_code == 503
    assert answer.json()["checks"]["inbox"] == "not watched: inbox-worker restarting"
    assert answer.json()["checks"]["workers"].startswith("inbox-worker restarting")
