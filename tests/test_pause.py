"""Pause and resume: a real `dropbox-eval run --http-port` child holding intake and forge
writes while paused, across a restart; the operator-only API; `submit` while paused."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from conftest import PATIENCE, read_json, served, tasks, wait_for
from helpers import drop, receipt_of
from test_retry import Home

from dropbox_eval.app import App
from dropbox_eval.errors import EXIT_FAILED
from dropbox_eval.sandbox import SandboxForge

KEY = "pause-operator-key"


class Running:
    """`dropbox-eval run --http-port 0` as a child process; its URL and its log lines."""

    def __init__(self, home: Home, extra_env: dict[str, str] | None = None) -> None:
        env = home.env() | {"SAAS_EVAL_OPERATOR_KEY": KEY, "SAAS_EVAL_POLL_INTERVAL": "0.5"}
        env |= extra_env or {}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dropbox_eval", "run", "--http-port", "0"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        assert wait_for(lambda: bool(self.url)), self.lines

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = re.search(r"operator page at (http://\S+)/operator", line)
            if found:
                self.url = found.group(1)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=PATIENCE) == 0, self.lines[-20:]


@pytest.fixture
def home(tmp_path: Path, forge: SandboxForge) -> Home:
    made = Home(tmp_path, forge)
    assert made.run("clients", "add", "acme", "--credits", "20").returncode == 0
    return made


@pytest.fixture
def service(home: Home) -> Iterator[Running]:
    running = Running(home)
    yield running
    if running.process.poll() is None:
        running.stop()


def _drop(home: Home, name: str, count: int = 1) -> Path:
    batch = {"batch_ref": Path(name).stem, "tasks": tasks(count)}
    return drop(home.home / "inbox", name, batch, "acme")


def _receipt(home: Home, name: str) -> Path:
    return receipt_of(home.home / "inbox" / "acme" / name)


def _writes(forge: SandboxForge) -> list[str]:
    return [f"{r.method} {r.path}" for r in forge.requests if r.method not in ("GET", "HEAD")]


def test_a_pause_holds_files_and_forge_writes_across_a_restart_until_resume(
    home: Home, forge: SandboxForge, service: Running
) -> None:
    _drop(home, "before.json", 2)
    _drop(home, "cancelled.json")
    assert wait_for(lambda: _receipt(home, "cancelled.json").exists())
    assert wait_for(lambda: _receipt(home, "before.json").exists())
    before = read_json(_receipt(home, "before.json"))["batch_id"]
    cancelled = read_json(_receipt(home, "cancelled.json"))["batch_id"]
    assert wait_for(lambda: home.json("batch", before)["intake_done"])
    assert wait_for(lambda: home.json("batch", cancelled)["intake_done"])

    paused = home.run("pause")
    assert paused.returncode == 0 and paused.stdout.startswith("paused since ")
    since = home.json("status")["paused_since"]
    assert since and home.json("status")["paused"] is True
    assert f"intake: paused since {since} by cli" in home.run("status").stdout
    ready = requests.get(f"{service.url}/readyz", timeout=PATIENCE).json()
    assert ready["paused"] is True and ready["message"] == f"paused since {since}"
    forge.clear_requests()

    waiting = _drop(home, "waiting.json")
    source = home.home / "submitted.json"
    source.write_text(json.dumps({"batch_ref": "submitted", "tasks": tasks(1)}), "utf-8")
    submitted = home.run("submit", str(source), "--client", "acme")
    assert submitted.returncode == EXIT_FAILED and "intake is paused since" in submitted.stderr
    stored = home.run("cancel", cancelled)
    assert stored.returncode == 0 and "cancel stored" in stored.stdout
    home.finish(before)  # the lane closes issues: polling and delivery go on
    assert wait_for(lambda: (home.home / "outbox" / f"{before}.json").exists())
    assert read_json(home.home / "outbox" / f"{before}.json")["status"] == "completed"
    assert not wait_for(lambda: _receipt(home, "waiting.json").exists(), 2.0)
    assert waiting.exists() and not (waiting.parent / "rejected").exists()
    assert home.json("batch", cancelled)["status"] == "running"
    assert _writes(forge) == []  # no issue created, commented, labelled or closed

    service.stop()  # the pause is in the state folder: a restart keeps it
    again = Running(home)
    try:
        assert wait_for(lambda: any("intake is paused since" in line for line in again.lines))
        assert not wait_for(lambda: _receipt(home, "waiting.json").exists(), 2.0)
        assert home.json("status")["paused_since"] == since
        resumed = home.run("resume")
        assert resumed.returncode == 0 and f"paused since {since}" in resumed.stdout
        assert wait_for(lambda: _receipt(home, "waiting.json").exists())
        assert wait_for(lambda: _receipt(home, "submitted.json").exists())
        assert wait_for(lambda: not waiting.exists())  # the receipt lands first
        assert wait_for(lambda: home.json("batch", cancelled)["status"] == "cancelled")
        new = read_json(_receipt(home, "waiting.json"))["batch_id"]
        assert new not in (before, cancelled)
        assert wait_for(lambda: home.json("batch", new)["intake_done"])
        assert any(w.startswith("POST ") and w.endswith("/issues") for w in _writes(forge))
        status = home.json("status")
        assert status["paused"] is False and status["paused_since"] is None
        assert "paused" not in home.run("status").stdout
    finally:
        again.stop()


def test_submit_while_paused_leaves_the_file_in_the_inbox(home: Home) -> None:
    assert home.run("pause").returncode == 0
    assert home.run("pause").returncode == 0  # pausing again keeps the first time
    source = home.home / "one.json"
    source.write_text(json.dumps({"tasks": tasks(1)}), encoding="utf-8")
    done = home.run("submit", str(source), "--client", "acme", "--json")
    assert done.returncode == EXIT_FAILED, done.stdout
    assert "intake is paused since" in json.loads(done.stdout)["message"]
    assert (home.home / "inbox" / "acme" / "one.json").exists()
    assert not (home.home / "inbox" / "acme" / "accepted").exists()
    assert home.run("resume").returncode == 0
    assert home.run("resume").stdout.startswith("not paused")
    assert home.run("run", "--once").returncode == 0  # now it is taken
    assert _receipt(home, "one.json").exists()


def _pause_kept(app: App) -> bool:
    """Whether the pause is kept where every process sees it: the state folder's pause
    file, or the store's shared flag on a database (intake/pause.py)."""
    flags = app.store.flags()
    if flags is None:
        return (app.settings.state_path / "paused.json").exists()
    return flags.get("pause") is not None


def test_the_pause_api_is_the_operators_only(app: App) -> None:
    app.settings.operator_key = KEY
    app.billing.add_client("acme", 5)
    client_key = app.billing.new_api_key("acme")
    with served(app) as url:

        def call(method: str, path: str, key: str) -> requests.Response:
            headers = {"Authorization": f"Bearer {key}"}
            return requests.request(method, f"{url}{path}", headers=headers, timeout=PATIENCE)

        for path in ("/api/eval/pause", "/api/eval/resume"):
            refused = call("POST", path, client_key)
            assert refused.status_code == 401 and refused.json()["reason"] == "unauthorized"
        assert call("GET", "/api/eval/pause", KEY).json()["paused"] is False
        paused = call("POST", "/api/eval/pause", KEY).json()
        assert paused["paused"] is True and paused["paused_by"] == "api"
        assert _pause_kept(app)
        ready = requests.get(f"{url}/readyz", timeout=PATIENCE).json()
        assert ready["paused_since"] == paused["paused_since"]
        body = json.dumps({"tasks": tasks(1)})
        posted = requests.post(
            f"{url}/api/eval/batches",
            data=body,
            headers={"Authorization": f"Bearer {client_key}"},
            timeout=PATIENCE,
        )
        assert posted.status_code == 201 and posted.json()["issues"][0]["issue_number"] is None
        resumed = call("POST", "/api/eval/resume", KEY).json()
        assert resumed["paused"] is False and resumed["was_paused_since"] == paused["paused_since"]
        assert not _pause_kept(app)


@pytest.mark.parametrize("spoiled", ["bad bytes", "a folder"])
def test_an_unreadable_pause_file_still_pauses_and_resume_clears_it(
    home: Home, spoiled: str
) -> None:
    pause_file = home.home / "state" / "paused.json"
    pause_file.parent.mkdir(parents=True, exist_ok=True)
    if spoiled == "a folder":
        pause_file.mkdir()
    else:
        pause_file.write_bytes(b"\xff\xfe{")
    status = home.run("status", "--json")  # exit 3: no service runs here
    assert "Traceback" not in status.stderr, status.stderr  # a pause, not a crash
    assert json.loads(status.stdout)["paused"] is True
    assert "unknown" in json.loads(status.stdout)["paused_since"]
    resumed = home.run("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert not pause_file.exists()


def test_wrong_keys_on_the_pause_api_are_throttled_like_the_sign_in(app: App) -> None:
    app.settings.operator_key = KEY
    with served(app) as url:
        answers = [
            requests.post(
                f"{url}/api/eval/pause",
                headers={"Authorization": f"Bearer wrong-{n}"},
                timeout=PATIENCE,
            )
            for n in range(8)
        ]
        codes = [a.status_code for a in answers]
        assert codes[0] == 401 and 429 in codes, codes
        closed = answers[codes.index(429)]
        assert closed.json()["reason"] == "too_many_attempts" and closed.headers["Retry-After"]
        right = requests.post(
            f"{url}/api/eval/pause", headers={"Authorization": f"Bearer {KEY}"}, timeout=PATIENCE
        )
        assert right.status_code == 429  # the address waits, whatever key it sends
    assert not (app.settings.state_path / "paused.json").exists()


def test_the_pause_api_says_when_no_operator_key_is_set(app: App) -> None:
    app.settings.operator_key = None
    with served(app) as url:
        answer = requests.post(
            f"{url}/api/eval/pause", headers={"Authorization": "Bearer x"}, timeout=PATIENCE
        )
    assert answer.status_code == 503 and answer.json()["reason"] == "not_configured"
