"""Defects a hostile review of the merged work found, each with its regression test."""

from __future__ import annotations

import json
import os

import requests
from click.testing import CliRunner
from conftest import read_json, tasks

from dropbox_eval.app import App
from dropbox_eval.cli import main
from dropbox_eval.config import Settings
from dropbox_eval.errors import ForgePermanent
from dropbox_eval.lifecycle.attempts import is_permanent
from dropbox_eval.models import BatchStatus, TaskStatus
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api


def test_a_file_name_that_is_not_utf8_is_rejected_before_anything_is_created(
    app: App, funded: str
) -> None:
    folder = os.fsencode(app.inbox.root / funded)
    os.makedirs(folder, exist_ok=True)
    raw = os.path.join(folder, b"\xff\xfebad.json")
    with open(raw, "wb") as handle:
        handle.write(json.dumps({"tasks": tasks(1)}).encode())
    path = app.inbox.root / funded / os.fsdecode(b"\xff\xfebad.json")
    outcome = app.inbox.process(path)
    assert outcome.status == "rejected" and outcome.document["reason"] == "invalid_name"
    assert app.store.list_batches() == [] and app.billing.client(funded).held == 0
    assert not os.path.exists(raw)


def test_a_4xx_to_a_read_is_a_failed_visit_not_a_failed_batch(
    app: App, forge: SandboxForge, funded: str
) -> None:
    assert is_permanent(ForgePermanent("POST /issues: 413", 413, "POST"))
    assert not is_permanent(ForgePermanent("GET /issues: 422", 422, "GET"))
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    forge.fail_next(3, 422, path_contains="/issues", method="GET")
    Service(app).poll_cycle()
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.RUNNING and batch.attempts == 1


def test_a_failing_batch_closes_every_open_issue_even_when_comments_are_refused(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(5))["batch_id"]
    repo = app.store.get_batch(batch_id).repo.split("/", 1)[1]
    forge.fail_next(100, 413, path_contains="/comments", method="POST")
    app.lifecycle.fail(batch_id, "the forge refused the request")
    assert app.store.get_batch(batch_id).status == BatchStatus.FAILED
    assert [i["state"] for i in forge.issues(forge.user, repo)] == ["closed"] * 5
    assert {t.status for t in app.store.get_tasks(batch_id)} == {TaskStatus.ABORTED}


def test_cancel_without_the_forge_is_stored_and_finished_by_the_service(
    app: App, settings: Settings, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    runner = CliRunner()
    env = {"SAAS_EVAL_HOME": str(settings.home), "SAAS_EVAL_GITEA_URL": ""}
    answer = runner.invoke(main, ["cancel", batch_id], env=env, catch_exceptions=False)
    assert answer.exit_code == 0, answer.output
    assert "cancel stored" in answer.output
    assert app.store.get_batch(batch_id).cancel_requested
    Service(app).poll_cycle()
    assert app.store.get_batch(batch_id).status == BatchStatus.CANCELLED


def test_every_api_error_is_a_problem_document_and_a_non_http_callback_is_refused(
    app: App, funded: str
) -> None:
    server = BackgroundServer(create_api(app), name="api")
    url = server.start()
    try:
        unknown = requests.get(f"{url}/no/such/path", timeout=30)
        assert unknown.status_code == 404 and unknown.json()["ok"] is False
        headers = {"Authorization": f"Bearer {app.billing.new_api_key(funded)}"}
        body = {"callback_url": "ftp://example.com/hook", "tasks": tasks(1)}
        answer = requests.post(f"{url}/api/eval/batches", json=body, headers=headers, timeout=30)
        assert answer.status_code == 422 and answer.json()["reason"] == "callback_refused"
    finally:
        server.stop()
    path = app.inbox.root / funded / "ftp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"callback_url": "ftp://example.com/hook", "tasks": tasks(1)}))
    app.inbox.process(path)
    assert read_json(path.with_name("rejected") / "ftp.json.error.json")["reason"] == (
        "callback_refused"
    )
