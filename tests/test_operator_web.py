"""The operator's HTTP view: /metrics (scraped with the Prometheus parser), health, page."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from conftest import tasks, wait_for
from prometheus_client.parser import text_string_to_metric_families

from dropbox_eval.app import App
from dropbox_eval.fileio import write_atomically
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.web.metrics import route_template
from dropbox_eval.web.server import create_web
from dropbox_eval.webserver import BackgroundServer

KEY = "operator-secret-key"


@pytest.fixture
def web(app: App) -> Iterator[str]:
    """The web app over `app`, on a loopback port, with an operator key."""
    app.settings.operator_key = KEY
    server = BackgroundServer(create_web(app, lambda: True))
    yield server.start()
    server.stop()


def _drop(app: App, client: str, name: str, body: str) -> Path:
    path = app.settings.inbox_path / client / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, body)
    return path


def _finish_all(app: App, forge: SandboxForge, batch_id: str, labels: list[str]) -> None:
    owner, name = app.store.get_batch(batch_id).repo.split("/")
    for issue, label in zip(forge.issues(owner, name), labels, strict=True):
        forge.finish_issue(owner, name, issue["number"], comment="done", labels=[label])


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_route_templates_bound_the_label_values() -> None:
    assert route_template("/api/v1/repos/org/eval-a-1/issues/12/comments") == (
        "/api/v1/repos/{owner}/{repo}/issues/{id}/comments"
    )
    assert route_template("/api/v1/orgs/eval-org/repos") == "/api/v1/orgs/{name}/repos"
    assert route_template("/api/v1/user") == "/api/v1/user"


def test_metrics_match_the_store_after_a_demo_sized_run(
    app: App, forge: SandboxForge, funded: str, web: str
) -> None:
    _drop(app, funded, "one.json", json.dumps({"batch_ref": "one", "tasks": tasks(3)}))
    _drop(app, funded, "bad.json", "{not json")
    _drop(app, funded, "empty.json", json.dumps({"tasks": []}))
    Service(app).run(once=True)
    done_id = app.store.find_batch(funded, batch_ref="one")
    assert done_id is not None
    _finish_all(app, forge, done_id, ["eval-pass", "eval-fail", "eval-pass"])
    running_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    Service(app).run(once=True)
    waiting = _drop(app, funded, "later.json.part", "x").with_name("later.json")
    waiting.write_text("{}")  # dropped after the last pass: waits for the service

    samples = _samples(web)
    rows = app.store.list_batches()
    assert {r["status"] for r in rows} == {"emitted", "running"}
    for status in ("emitted", "running", "cancelled"):
        count = sum(1 for r in rows if r["status"] == status)
        assert samples[("dropbox_eval_batches", (("status", status),))] == count
    every_task = [t for r in rows for t in app.store.get_tasks(r["batch_id"])]
    for status in ("passed", "failed", "open"):
        count = sum(1 for t in every_task if t.status == status)
        assert samples[("dropbox_eval_tasks", (("status", status),))] == count
    assert samples[("dropbox_eval_tasks", (("status", "passed"),))] == 2
    assert samples[("dropbox_eval_batches_accepted_total", (("source", "inbox"),))] == 1
    assert samples[("dropbox_eval_batches_accepted_total", (("source", "api"),))] == 1
    assert samples[("dropbox_eval_files_rejected_total", (("reason", "invalid_json"),))] == 1
    assert sum(v for (n, _), v in samples.items() if n == "dropbox_eval_files_rejected_total") == 2
    charged = sum(-e.amount for e in app.store.ledger(funded) if e.kind == "charge")
    assert charged == 3 * app.settings.task_price
    assert samples[("dropbox_eval_credits_charged_total", (("client", funded),))] == charged
    client = app.billing.client(funded)
    assert samples[("dropbox_eval_credits_held", (("client", funded),))] == client.held == 4
    assert samples[("dropbox_eval_credits_balance", (("client", funded),))] == client.balance
    assert samples[("dropbox_eval_reports", (("outcome", "delivered"),))] == 1
    assert samples[("dropbox_eval_reports", (("outcome", "pending"),))] == 0
    assert samples[("dropbox_eval_oldest_undelivered_report_age_seconds", ())] == 0
    assert samples[("dropbox_eval_inbox_waiting_files", ())] == 1
    assert samples[("dropbox_eval_service_running", ())] == 0  # the passes ended
    created = (
        "dropbox_eval_forge_requests_total",
        (("code", "201"), ("method", "POST"), ("route", "/api/v1/repos/{owner}/{repo}/issues")),
    )
    assert samples[created] == 5  # one issue per task of both batches
    timed = (
        "dropbox_eval_forge_request_duration_seconds_count",
        (("method", "POST"), ("route", "/api/v1/repos/{owner}/{repo}/issues")),
    )
    assert samples[timed] == 5
    assert running_id in {r["batch_id"] for r in rows}


def test_an_undelivered_report_shows_its_age(
    app: App, forge: SandboxForge, funded: str, web: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1), callback_url="http://127.0.0.1:9/closed")[
        "batch_id"
    ]
    _finish_all(app, forge, batch_id, ["eval-pass"])
    Service(app).run(once=True)
    assert app.store.get_batch(batch_id).delivery_attempts == 1
    samples = _samples(web)
    assert samples[("dropbox_eval_reports", (("outcome", "pending"),))] == 1
    assert samples[("dropbox_eval_oldest_undelivered_report_age_seconds", ())] >= 0


def test_healthz_and_readyz(app: App, forge: SandboxForge) -> None:
    watched = [True]
    server = BackgroundServer(create_web(app, lambda: watched[0]))
    url = server.start()
    try:
        assert requests.get(f"{url}/healthz", timeout=5).json() == {"ok": True}
        ready = requests.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json()["checks"] == {"store": "ok", "forge": "ok", "inbox": "ok"}
        watched[0] = False
        forge.stop()
        server.stop()  # a new server: the readiness answer is cached for a few seconds
        server = BackgroundServer(create_web(app, lambda: watched[0]))
        url = server.start()
        answer = requests.get(f"{url}/readyz", timeout=30)
        assert answer.status_code == 503
        checks = answer.json()["checks"]
        assert checks["store"] == "ok"
        assert checks["forge"].startswith("forge unreachable")
        assert checks["inbox"] == "no service is watching the inbox"
    finally:
        server.stop()


def test_the_page_needs_the_operator_key(app: App, funded: str, web: str) -> None:
    page = requests.get(f"{web}/operator", timeout=5)
    assert page.status_code == 401 and 'name="key"' in page.text
    assert funded not in page.text
    wrong = requests.get(f"{web}/operator", params={"key": "nope"}, timeout=5)
    assert wrong.status_code == 401 and "not right" in wrong.text
    session = requests.Session()
    signed = session.post(f"{web}/operator/login", data={"key": KEY}, timeout=5)
    assert signed.status_code == 200 and signed.url.endswith("/operator")
    assert funded in signed.text and 'name="viewport"' in signed.text
    assert 'http-equiv="refresh"' in signed.text
    cookie = next(iter(session.cookies))
    assert cookie.has_nonstandard_attr("HttpOnly")
    forged = requests.post(f"{web}/operator/batches/x/deliver", timeout=5)
    assert forged.status_code == 401


def test_the_page_is_off_without_a_key(app: App) -> None:
    server = BackgroundServer(create_web(app, lambda: True))
    url = server.start()
    try:
        for key in ("", "anything"):
            page = requests.get(f"{url}/operator", params={"key": key}, timeout=5)
            assert page.status_code == 401 and "SAAS_EVAL_OPERATOR_KEY" in page.text
    finally:
        server.stop()


def test_run_with_http_port_serves_metrics_and_the_page(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env |= {"SAAS_EVAL_HOME": str(tmp_path), "SAAS_EVAL_OPERATOR_KEY": KEY}
    process = subprocess.Popen(
        [sys.executable, "-m", "dropbox_eval", "run", "--sandbox", "--http-port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    try:
        url = ""
        for line in process.stderr:
            found = re.search(r"operator page at (http://\S+)/operator", line)
            if found:
                url = found.group(1)
                break
        assert url, "the service never said where its page is"
        assert wait_for(lambda: requests.get(f"{url}/readyz", timeout=5).ok, 10)
        metrics = requests.get(f"{url}/metrics", timeout=5).text
        assert "dropbox_eval_service_running 1.0" in metrics
        page = requests.get(f"{url}/operator", params={"key": KEY}, timeout=5)
        assert page.status_code == 200 and "Service health" in page.text
        assert f"pid {process.pid} since" in page.text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0


def test_the_access_log_never_shows_the_operator_key() -> None:
    import logging

    from dropbox_eval.cli.logs import RedactKey

    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/operator?note=x&key={KEY}", "1.1", 303),
        None,
    )
    assert RedactKey().filter(record)
    assert KEY not in record.getMessage() and "key=***" in record.getMessage()
