"""`submit` beside a running service: the file is handed over, never raced for;
the command reports exactly what the service filed, and never says `busy` for a file the
service accepted. Real `dropbox-eval submit` processes, a real service on the same home."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import forkrun
import pytest
from conftest import settings_on, tasks, wait_for
from filelock import FileLock

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.sandbox import SandboxForge


def submit(home: Path, forge: SandboxForge, file: Path, *args: str) -> forkrun.Finished:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")},
        "SAAS_EVAL_HOME": str(home),
        "SAAS_EVAL_GITEA_URL": forge.url,
        "SAAS_EVAL_GITEA_TOKEN": forge.token,
        "SAAS_EVAL_OWNER": forge.user,
    }
    return forkrun.run(["-v", "submit", str(file), "--json", *args], env, 120)


@pytest.fixture
def running(tmp_path: Path, forge: SandboxForge) -> Iterator[App]:
    """A service on tmp_path whose quiet period is 600 s: only a rename into place, which
    is what `submit` hands over, is read at once."""
    settings = settings_on(
        forge, tmp_path, quiet_period=600.0, rescan_interval=600.0, poll_interval=600.0
    )
    app = build_app(settings)
    app.billing.add_client("acme", 100)
    # the client's folder exists, as after its first SFTP login: inotify reports a file
    # renamed into a folder created a moment before only as a synthetic "created" event,
    # which waits the quiet period like any file written in place
    (settings.inbox_path / "acme").mkdir(parents=True)
    service = service_for(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    assert wait_for(lambda: service.status.get("last_poll_at") is not None, 30)
    try:
        yield app
    finally:
        service.stop()
        thread.join(timeout=30)


def test_submit_beside_a_running_service_reports_what_the_service_filed(
    running: App, forge: SandboxForge, tmp_path: Path
) -> None:
    home = running.settings.home
    for n in range(8):  # the issue saw `busy` in 4 of 12 tries
        source = tmp_path / f"n{n}.json"
        source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(2, prefix=f"n{n}-")}))
        done = submit(home, forge, source)
        assert done.returncode == 0, done.stdout + done.stderr
        receipt = json.loads(done.stdout)
        assert receipt["ok"] is True and receipt["file"] == source.name
        assert "busy" not in done.stdout + done.stderr
        assert "reading" not in done.stderr  # the service read it, not the command
        filed = running.settings.inbox_path / "accepted" / f"{source.name}.receipt.json"
        assert json.loads(filed.read_text()) == receipt  # exactly what the service filed
        assert running.store.get_batch(receipt["batch_id"]).total == 2
    assert not [p for p in running.settings.inbox_path.iterdir() if p.is_file()]

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rejected = submit(home, forge, bad, "--client", "acme")
    assert rejected.returncode == 4, rejected.stdout + rejected.stderr
    error = json.loads(rejected.stdout)
    assert error["ok"] is False and error["reason"] == "invalid_json"
    assert (running.settings.inbox_path / "acme" / "rejected" / "bad.json.error.json").exists()


def _funded_with_file(tmp_path: Path, forge: SandboxForge, name: str) -> tuple[App, Path]:
    """A state with a funded client, and a one-task batch file for it outside the inbox."""
    app = build_app(settings_on(forge, tmp_path))
    app.billing.add_client("acme", 100)
    source = tmp_path / name
    source.write_text(json.dumps({"client_id": "acme", "tasks": tasks(1)}))
    return app, source


def test_a_service_that_does_not_take_the_file_in_time_keeps_it(
    tmp_path: Path, forge: SandboxForge
) -> None:
    app, source = _funded_with_file(tmp_path, forge, "slow.json")
    with FileLock(str(tmp_path / "state" / "service.lock")):  # a service that takes nothing
        done = submit(tmp_path, forge, source, "--timeout", "0.5")
    assert done.returncode == 1, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and answer["reason"] == "not_filed_yet"
    assert "stays in the inbox" in answer["message"]
    assert (tmp_path / "inbox" / "slow.json").exists()  # handed over, waiting for the service
    assert service_for(app).run(once=True) == 0
    assert (tmp_path / "inbox" / "accepted" / "slow.json.receipt.json").exists()


def test_a_service_that_stops_before_filing_leaves_the_file_to_submit(
    tmp_path: Path, forge: SandboxForge
) -> None:
    app, source = _funded_with_file(tmp_path, forge, "late.json")
    lock = FileLock(str(tmp_path / "state" / "service.lock"), thread_local=False)
    lock.acquire()
    released = threading.Timer(1.0, lock.release)
    released.start()
    try:
        done = submit(tmp_path, forge, source, "--timeout", "60")
    finally:
        released.join()
    assert done.returncode == 0, done.stdout + done.stderr
    receipt = json.loads(done.stdout)
    assert receipt["ok"] is True and app.store.get_batch(receipt["batch_id"]).total == 1
