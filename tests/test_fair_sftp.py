"""Fair intake for SFTP uploads: an upload finished over the built-in endpoint is renamed
into place on close and reaches intake through the inbox's ready lines (the watcher's rename
event), so it is served client by client in turn like any other drop: one client's burst of
uploads does not stand in front of another client's upload."""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import settings_on, tasks, wait_for
from helpers import receipt_of
from sftp_stack import Stack, keygen, register, sftp, start_endpoint
from test_fair_inbox import filed

from dropbox_eval.app import build_app, service_for
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.workers.inbox import INBOX_WORKERS

BURST = 24


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Stack, Service]]:
    """The service (in a thread) and the endpoint (a subprocess) on one home, clients alpha
    and bravo with keys; files are read only when a rename puts them in place (the quiet
    period and the rescans are 10 minutes away)."""
    with SandboxForge(port=0) as forge:
        app = build_app(
            settings_on(forge, tmp_path, quiet_period=600.0, rescan_interval=600.0, task_price=0)
        )
        keys = {client: keygen(tmp_path / f"key-{client}") for client in ("alpha", "bravo")}
        for client, key in keys.items():
            (app.settings.inbox_path / client).mkdir(parents=True)
            register(app, client, key)
        service = service_for(app)
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        assert wait_for(lambda: service.status.get("last_poll_at") is not None)
        log = tmp_path / "sftp.log"
        proc, port = start_endpoint(tmp_path, log, {})
        host_key = (app.settings.state_path / "sftp" / "ssh_host_ed25519_key.pub").read_text()
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(host_key.split()[:2])}\n")
        try:
            yield Stack(tmp_path, port, app, forge, keys, known_hosts, log, proc.pid), service
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
            service.stop()
            thread.join(timeout=20)


def upload(stack: Stack, client: str, names: list[str], folder: Path) -> None:
    """`put` each named file of `folder` over OpenSSH's sftp, as `client`, in one session."""
    commands = "".join(f"put {name}\n" for name in names)
    done = sftp(stack, commands, user=client, key=client, cwd=folder)
    assert done.returncode == 0, done.stderr


def test_sftp_uploads_are_served_client_by_client(
    stack: tuple[Stack, Service], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Intake is paused while alpha uploads 24 batches and then bravo one; on resume,
    bravo's is filed within the first turns (first come, first served would file it
    last: it came last, and alpha's folder sorts first)."""
    running, service = stack
    local = tmp_path / "local"
    local.mkdir()
    names = [f"a{index:02}.json" for index in range(BURST)]
    for index, name in enumerate(names):
        (local / name).write_text(json.dumps({"tasks": tasks(1, f"a{index}-")}))
    (local / "b.json").write_text(json.dumps({"tasks": tasks(1)}))
    caplog.set_level(logging.INFO, logger="dropbox_eval")
    running.app.pause.pause(by="test")
    upload(running, "alpha", names, local)
    upload(running, "bravo", ["b.json"], local)
    # every upload reached the inbox worker by its rename event; none is read while paused
    assert wait_for(lambda: service.inbox.pending() == BURST + 1)
    assert filed(caplog) == []
    running.app.pause.resume()
    single = running.folder("bravo") / "b.json"
    assert wait_for(lambda: receipt_of(single).exists())
    assert wait_for(lambda: len(filed(caplog)) == BURST + 1)
    order = filed(caplog)
    assert order.index("b.json") < INBOX_WORKERS + 2, order[: INBOX_WORKERS + 2]
    assert json.loads(receipt_of(single).read_text())["client_id"] == "bravo"
