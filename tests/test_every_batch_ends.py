"""Every batch ends, and one slow peer or one bad batch never stalls the rest."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from conftest import PATIENCE, read_json, settings_on, tasks, wait_for

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.config import Settings
from dropbox_eval.models import BatchStatus, TaskStatus, utcnow
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.store import BatchRow
from dropbox_eval.util.fileio import write_atomically
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api


@pytest.fixture(params=["gitea", "forgejo"])
def flavoured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[App, SandboxForge]]:
    """An app on a sandbox of each flavour (Gitea answers 500 where Forgejo answers 404)."""
    with SandboxForge(port=0, flavor=request.param) as forge:
        settings = settings_on(
            forge, tmp_path, quiet_period=0.1, poll_interval=0.2, retry_base=0.2, retry_cap=1.0
        )
        app = build_app(settings)
        app.billing.add_client("acme", 100)
        yield app, forge


def test_cancel_with_a_deleted_issue_ends_cancelled_with_that_task_missing_in_one_cycle(
    flavoured: tuple[App, SandboxForge],
) -> None:
    app, forge = flavoured
    batch_id = app.intake.submit_batch("acme", tasks(2))["batch_id"]
    first = app.store.get_tasks(batch_id)[0]
    forge.delete_issue(forge.user, f"eval-acme-{batch_id}", first.issue_number or 0)
    app.store.update_batch(batch_id, cancel_requested=True)  # a cancel the service finishes
    service_for(app).poll_cycle()
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.CANCELLED
    statuses = {t.task_id: t.status for t in app.store.get_tasks(batch_id)}
    assert statuses == {"t1": TaskStatus.MISSING, "t2": TaskStatus.CANCELLED}
    assert app.billing.client("acme").held == 0


def test_413_on_issue_creation_fails_the_batch_with_a_report_and_the_hold_released(
    app: App, forge: SandboxForge, funded: str
) -> None:
    forge.fail_next(1, 413, path_contains="/issues", method="POST")
    receipt = app.intake.submit_batch(funded, tasks(3))
    batch = app.store.get_batch(receipt["batch_id"])
    assert batch.status == BatchStatus.FAILED and "413" in (batch.failure or "")
    assert receipt["status"] == "failed" and "413" in receipt["failure"]
    client = app.billing.client(funded)
    assert (client.balance, client.held) == (100, 0)  # nothing charged, hold released
    app.delivery.emit(batch.batch_id)
    report = read_json(app.settings.outbox_path / f"{batch.batch_id}.json")
    assert report["status"] == "failed" and "413" in report["failure"]
    assert {r["status"] for r in report["results"]} == {"aborted"}


def test_a_failure_that_keeps_repeating_ends_the_batch_failed(
    settings: Settings, forge: SandboxForge
) -> None:
    app = build_app(settings.model_copy(update={"max_attempts": 3, "retry_base": 0.01}))
    app.billing.add_client("acme", 100)
    forge.fail_next(10**6, 503, path_contains="/repos/eval/eval-acme-")
    batch_id = app.intake.submit_batch("acme", tasks(1))["batch_id"]
    service = service_for(app)
    assert wait_for(lambda: _cycled(service) and _status(app, batch_id) == "failed")
    batch = app.store.get_batch(batch_id)
    assert batch.attempts >= 3 and "503" in (batch.last_error or "")
    assert "3 visits" in (batch.failure or "")


def _cycled(service: Service) -> bool:
    service.poll_cycle()
    return True


def _status(app: App, batch_id: str) -> str:
    return str(app.store.get_batch(batch_id).status)


def test_the_deadline_wins_even_while_the_forge_is_down(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    app.store.update_batch(batch_id, deadline=utcnow() - timedelta(seconds=1))
    forge.fail_for(60, 503)
    service_for(app).poll_cycle()
    assert app.store.get_batch(batch_id).status == BatchStatus.EXPIRED
    assert app.billing.client(funded).held == 0


def test_the_api_refuses_what_the_inbox_refuses_with_the_same_answers(
    app: App, funded: str
) -> None:
    server = BackgroundServer(create_api(app.web), name="api")
    url = server.start() + "/api/eval/batches"
    headers = {"Authorization": f"Bearer {app.billing.new_api_key(funded)}"}
    task = json.dumps(tasks(1)[0])
    bodies = {
        "duplicate": f'{{"title": "x", "tasks": [{task}], "tasks": [{task}]}}'.encode(),
        "surrogate": f'{{"tasks": [{task}], "batch_ref": "\\ud800"}}'.encode(),
        "malformed": b'{"tasks": [',
    }
    try:
        for name, raw in bodies.items():
            answer = requests.post(url, data=raw, headers=headers, timeout=30)
            path = app.inbox.root / funded / f"{name}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(raw)
            error = app.inbox.process(path).document
            assert answer.status_code == 422, (name, answer.text)
            assert answer.json()["reason"] == error["reason"], name
            assert answer.json()["message"] == error["message"], name
        too_big = b" " * (app.settings.max_file_bytes + 1)
        answer = requests.post(url, data=too_big, headers=headers, timeout=30)
        assert answer.status_code == 413 and answer.json()["reason"] == "too_large"
    finally:
        server.stop()
    assert app.store.list_batches() == []


def test_a_broken_client_delays_nobody_else(settings: Settings, forge: SandboxForge) -> None:
    """A's repo answers 503 and A's callback takes the connection and never answers; B's
    drops get their issues while A's report is still stuck in its delivery and A's batch
    is still being retried. Both of A's troubles last until the test ends them (a one-hour
    callback timeout, no retry limit), so B can only finish first if nothing of A's is in
    B's way: a worker that waited on A would make the wait for B's receipts run out."""
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(16)  # the kernel accepts connections; nobody ever answers them
    stuck = settings.model_copy(update={"callback_timeout": 3600.0, "max_attempts": 10**6})
    app = build_app(stuck)
    for client in ("alpha", "bravo"):
        app.billing.add_client(client, 100)
    callback = f"http://127.0.0.1:{hanging.getsockname()[1]}/hook"
    done = app.intake.submit_batch("alpha", tasks(1), callback_url=callback)["batch_id"]
    app.lifecycle.cancel(done)  # a finished batch whose delivery will hang
    forge.fail_next(10**6, 503, path_contains="/eval-alpha-")
    service = service_for(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        write_atomically(
            app.settings.inbox_path / "alpha" / "a.json", json.dumps({"tasks": tasks(2)})
        )
        assert wait_for(lambda: select.select([hanging], [], [], 0)[0] != [])  # A is called
        assert wait_for(lambda: any(_retried(app, row) for row in app.store.list_batches()))
        for n in range(3):
            write_atomically(
                app.settings.inbox_path / "bravo" / f"b{n}.json",
                json.dumps({"batch_ref": f"b{n}", "tasks": tasks(2)}),
            )
        receipts = app.settings.inbox_path / "bravo" / "accepted"
        assert wait_for(lambda: len(list(receipts.glob("*.receipt.json"))) == 3)
        bravo = [read_json(r)["batch_id"] for r in receipts.glob("*.receipt.json")]
        # B's issues all exist (a receipt names those made by then; when the service's
        # visit took a new batch over before the inbox's own try, that is none yet) ...
        assert wait_for(lambda: all(_opened(app, batch_id) for batch_id in bravo))
        # ... while A is still stuck on both counts
        assert service.delivery.pool.busy(done)
        assert app.store.get_batch(done).delivery_attempts == 0  # its first try hangs on
        rows = app.store.list_batches()
        alpha = [r for r in rows if r.client_id == "alpha" and r.batch_id != done]
        assert len(alpha) == 1 and alpha[0].status == BatchStatus.RUNNING
    finally:
        hanging.close()  # resets the waiting connection: A's delivery fails at once
        service.stop()
        thread.join(timeout=PATIENCE)
    assert not thread.is_alive()


def _opened(app: App, batch_id: str) -> bool:
    """Every task of the batch has its issue."""
    return all(task.issue_number for task in app.store.get_tasks(batch_id))


def _retried(app: App, row: BatchRow) -> bool:
    """An alpha batch the forge has already refused (503) and that waits to be tried again."""
    if row.client_id != "alpha" or row.status != BatchStatus.RUNNING:
        return False
    batch = app.store.get_batch(str(row.batch_id))
    return batch.attempts >= 1 and "503" in (batch.last_error or "")
