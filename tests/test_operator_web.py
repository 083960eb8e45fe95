"""The operator's HTTP view: /metrics (scraped with the Prometheus parser), health, page."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from conftest import OPERATOR_KEY, PATIENCE, served, tasks, wait_for
from fastapi import FastAPI
from helpers import drop, finish_issues
from prometheus_client.parser import text_string_to_metric_families

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.ops.metrics import route_template
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.fileio import write_atomically
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web
from dropbox_eval.web.session import SESSION_SECONDS, OperatorSessions

KEY = OPERATOR_KEY
COOKIE = "dropbox_eval_operator"
T = TypeVar("T")
_OPENED: list[str] | None = None  # files opened while a test watches (audit hook below)


@pytest.fixture
def web(app: App) -> Iterator[str]:
    """The web app over `app`, on a loopback port, with an operator key."""
    app.settings.operator_key = KEY
    with served(app) as url:
        yield url


@pytest.fixture
def operator(operator_web: tuple[str, FastAPI]) -> tuple[str, OperatorSessions]:
    """Like `web`, plus the page's session table (to move its clock)."""
    url, api = operator_web
    return url, api.state.operator_sessions


def _sign_in(url: str, **headers: str) -> tuple[requests.Session, requests.Response]:
    session = requests.Session()
    answer = session.post(f"{url}/operator/login", data={"key": KEY}, headers=headers, timeout=30)
    assert answer.status_code == 200 and "Service health" in answer.text
    return session, answer


def _page_with(url: str, token: str) -> requests.Response:
    """The page as a browser holding only a copy of the cookie `token` sees it."""
    return requests.get(f"{url}/operator", cookies={COOKIE: token}, timeout=30)


def _csrf(page: requests.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "the page's forms carry no CSRF token"
    return found.group(1)


def _archive_finished(
    app: App, forge: SandboxForge, client: str, count: int, labels: list[str]
) -> None:
    """`count` two-task batches the lane finishes with `labels`, then one service pass
    (results, reports, archive)."""
    for n in range(count):
        batch_id = app.intake.submit_batch(client, tasks(2), batch_ref=f"b{n}")["batch_id"]
        finish_issues(forge, app.store.get_batch(batch_id).repo, labels, comment="done")
    service_for(app).run(once=True)


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(f"{url}/metrics", timeout=30).text
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
    app.settings.metrics_per_client = True  # SAAS_EVAL_METRICS_PER_CLIENT
    inbox = app.settings.inbox_path
    drop(inbox, "one.json", {"batch_ref": "one", "tasks": tasks(3)}, funded)
    drop(inbox, "bad.json", "{not json", funded)
    drop(inbox, "empty.json", {"tasks": []}, funded)
    service_for(app).run(once=True)
    done_id = app.store.find_batch(funded, batch_ref="one")
    assert done_id is not None
    verdicts = ["eval-pass", "eval-fail", "eval-pass"]
    finish_issues(forge, app.store.get_batch(done_id).repo, verdicts, comment="done")
    running_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    service_for(app).run(once=True)
    waiting = drop(inbox, "later.json.part", "x", funded).with_name("later.json")
    waiting.write_text("{}")  # dropped after the last pass: waits for the service

    samples = _samples(web)
    rows = app.store.list_batches()
    assert {r.status for r in rows} == {"emitted", "running"}
    for status in ("emitted", "running", "cancelled"):
        count = sum(1 for r in rows if r.status == status)
        assert samples[("dropbox_eval_batches", (("status", status),))] == count
    every_task = [t for r in rows for t in app.store.get_tasks(r.batch_id)]
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
    assert running_id in {r.batch_id for r in rows}


def test_an_undelivered_report_shows_its_age(
    app: App, forge: SandboxForge, funded: str, web: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1), callback_url="http://127.0.0.1:9/closed")[
        "batch_id"
    ]
    finish_issues(forge, app.store.get_batch(batch_id).repo, comment="done")
    service_for(app).run(once=True)
    assert app.store.get_batch(batch_id).delivery_attempts == 1
    samples = _samples(web)
    assert samples[("dropbox_eval_reports", (("outcome", "pending"),))] == 1
    assert samples[("dropbox_eval_oldest_undelivered_report_age_seconds", ())] >= 0


def test_healthz_and_readyz(app: App, forge: SandboxForge) -> None:
    watched = [True]
    server = BackgroundServer(create_web(app.web, lambda: {} if watched[0] else None))
    url = server.start()
    try:
        assert requests.get(f"{url}/healthz", timeout=30).json() == {"ok": True}
        ready = requests.get(f"{url}/readyz", timeout=30)
        assert ready.status_code == 200
        assert ready.json()["checks"] == {
            "store": "ok",
            "state": "ok",
            "forge": "ok",
            "inbox": "ok",
            "workers": "ok",
            "storage": "ok",
        }
        watched[0] = False
        forge.stop()
        server.stop()  # a new server: the readiness answer is cached for a few seconds
        server = BackgroundServer(create_web(app.web, lambda: {} if watched[0] else None))
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
    page = requests.get(f"{web}/operator", timeout=30)
    assert page.status_code == 401 and 'name="key"' in page.text
    assert funded not in page.text
    wrong = requests.post(f"{web}/operator/login", data={"key": "nope"}, timeout=30)
    assert wrong.status_code == 401 and "not right" in wrong.text
    session = requests.Session()
    signed = session.post(f"{web}/operator/login", data={"key": KEY}, timeout=30)
    assert signed.status_code == 200 and signed.url.endswith("/operator")
    assert funded in signed.text and 'name="viewport"' in signed.text
    assert 'http-equiv="refresh"' in signed.text
    cookie = next(iter(session.cookies))
    assert cookie.has_nonstandard_attr("HttpOnly")
    forged = requests.post(f"{web}/operator/batches/x/deliver", timeout=30)
    assert forged.status_code == 401


def test_the_page_is_off_without_a_key(app: App) -> None:
    with served(app) as url:
        for key in ("", "anything"):
            page = requests.post(f"{url}/operator/login", data={"key": key}, timeout=30)
            assert page.status_code == 401 and "SAAS_EVAL_OPERATOR_KEY" in page.text


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
        assert wait_for(lambda: requests.get(f"{url}/readyz", timeout=30).ok)
        metrics = requests.get(f"{url}/metrics", timeout=30).text
        assert "dropbox_eval_service_running 1.0" in metrics
        page = requests.post(f"{url}/operator/login", data={"key": KEY}, timeout=30)
        assert page.status_code == 200 and "Service health" in page.text
        assert f"pid {process.pid} since" in page.text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=PATIENCE)
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


def test_the_login_cookie_is_a_session_token_not_the_key(
    operator: tuple[str, OperatorSessions],
) -> None:
    url, _ = operator
    session, answer = _sign_in(url)
    login = answer.history[0]
    set_cookie = login.headers["set-cookie"]
    token = login.cookies[COOKIE]
    assert KEY not in set_cookie and KEY not in token and len(token) >= 32
    for attribute in (
        "HttpOnly",
        "SameSite=strict",
        "Path=/operator",
        f"Max-Age={SESSION_SECONDS}",
    ):
        assert attribute.lower() in set_cookie.lower()
    assert "secure" not in set_cookie.lower()  # plain http: a Secure cookie would not come back
    assert _page_with(url, token).status_code == 200
    _, again = _sign_in(url)
    assert again.history[0].cookies[COOKIE] != token  # every login is its own session
    assert _page_with(url, KEY).status_code == 401  # a cookie holding the key is no session
    assert _page_with(url, token[:-1] + ("A" if token[-1] != "A" else "B")).status_code == 401
    assert session.get(f"{url}/operator", timeout=30).status_code == 200


def test_the_cookie_is_secure_when_the_request_came_over_https(app: App) -> None:
    """A TLS-terminating proxy on this host says so, and is listed as trusted
    (SAAS_EVAL_TRUSTED_PROXIES): only then is its X-Forwarded-Proto believed."""
    app.settings.operator_key = KEY
    app.settings.trusted_proxies = "127.0.0.1"
    server = BackgroundServer(create_web(app.web, lambda: {}))
    url = server.start()
    try:
        answer = requests.post(
            f"{url}/operator/login",
            data={"key": KEY},
            headers={"X-Forwarded-Proto": "https"},
            allow_redirects=False,
            timeout=30,
        )
    finally:
        server.stop()
    assert answer.status_code == 303 and "secure" in answer.headers["set-cookie"].lower()


def test_a_forwarded_proto_from_an_untrusted_peer_is_not_believed(
    operator: tuple[str, OperatorSessions],
) -> None:
    url, _ = operator  # no trusted proxy: the header is the client's word only
    answer = requests.post(
        f"{url}/operator/login",
        data={"key": KEY},
        headers={"X-Forwarded-Proto": "https"},
        allow_redirects=False,
        timeout=30,
    )
    assert answer.status_code == 303 and "secure" not in answer.headers["set-cookie"].lower()


def test_a_session_ends_on_expiry_and_on_a_new_key(
    app: App, operator: tuple[str, OperatorSessions]
) -> None:
    url, sessions = operator
    _, answer = _sign_in(url)
    token = answer.history[0].cookies[COOKIE]
    now = sessions.clock()
    sessions.clock = lambda: now + SESSION_SECONDS - 60
    assert _page_with(url, token).status_code == 200
    sessions.clock = lambda: now + SESSION_SECONDS + 1
    assert _page_with(url, token).status_code == 401
    assert len(sessions) == 0

    sessions.clock = lambda: now
    _, answer = _sign_in(url)
    token = answer.history[0].cookies[COOKIE]
    app.settings.operator_key = "a-rotated-key"
    assert _page_with(url, token).status_code == 401
    app.settings.operator_key = KEY  # the old key back does not revive the session
    assert _page_with(url, token).status_code == 401


def test_sign_out_ends_the_session_and_forms_need_its_csrf_token(
    funded: str, operator: tuple[str, OperatorSessions]
) -> None:
    url, _ = operator
    session, answer = _sign_in(url)
    token = answer.history[0].cookies[COOKIE]
    csrf = _csrf(answer)
    assert csrf != token and KEY not in csrf
    stale = "this form is out of date: reload the page and try again"
    no_token = session.post(f"{url}/operator/batches/x/deliver", timeout=30)
    assert no_token.status_code == 403 and stale in no_token.text  # signed in: not 401
    wrong = session.post(f"{url}/operator/logout", data={"csrf": csrf[::-1]}, timeout=30)
    assert wrong.status_code == 403 and stale in wrong.text
    stranger = requests.post(f"{url}/operator/logout", data={"csrf": csrf}, timeout=30)
    assert stranger.status_code == 401 and "sign in first" in stranger.text
    assert _page_with(url, token).status_code == 200  # a refused sign-out ends nothing
    redeliver = session.post(f"{url}/operator/batches/x/deliver", data={"csrf": csrf}, timeout=30)
    assert redeliver.status_code == 200 and "x: not delivered" in redeliver.text
    assert redeliver.url == f"{url}/operator"  # the outcome is not carried in the URL
    assert "x: not delivered" not in session.get(f"{url}/operator", timeout=30).text  # once
    crafted = session.get(f"{url}/operator?note=Call+support+at+555", timeout=30)
    assert crafted.status_code == 200 and "555" not in crafted.text  # links cannot add words

    out = session.post(f"{url}/operator/logout", data={"csrf": csrf}, timeout=30)
    assert out.status_code == 200 and "signed out" in out.text
    assert "Max-Age=0" in out.headers["set-cookie"] or "expires" in out.headers["set-cookie"]
    assert "samesite=strict" in out.headers["set-cookie"].lower()
    assert _page_with(url, token).status_code == 401  # a copy of the cookie is dead too
    assert funded not in session.get(f"{url}/operator", timeout=30).text


def _watch_opens(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook: note the paths opened or listed (any thread) while `_OPENED` is set."""
    watched = event in ("open", "os.scandir", "os.listdir")
    if _OPENED is not None and watched and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_watch_opens)  # only looks; inert unless a test sets _OPENED


def _opened_during(call: Callable[[], T]) -> tuple[T, list[str]]:
    global _OPENED
    _OPENED = []
    try:
        return call(), _OPENED
    finally:
        _OPENED = None


def _store_figures(app: App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics must say, counted the slow way: every record, archived ones too."""
    rows = app.store.list_batches()
    every_task = [t for r in rows for t in app.store.get_tasks(r.batch_id)]
    figures: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for status in ("emitted", "running", "failed"):
        count = sum(1 for r in rows if r.status == status)
        figures[("dropbox_eval_batches", (("status", status),))] = count
    for task_status in ("passed", "failed", "open"):
        count = sum(1 for t in every_task if t.status == task_status)
        figures[("dropbox_eval_tasks", (("status", task_status),))] = count
    for client in app.store.list_clients():
        charged = sum(-e.amount for e in app.store.ledger(client.client_id) if e.kind == "charge")
        figures[("dropbox_eval_credits_charged_total", (("client", client.client_id),))] = charged
        figures[("dropbox_eval_credits_held", (("client", client.client_id),))] = client.held
    delivered = sum(1 for r in rows if r.emitted_at)
    figures[("dropbox_eval_reports", (("outcome", "delivered"),))] = delivered
    api = sum(1 for r in rows if r.source in (None, "api"))
    figures[("dropbox_eval_batches_accepted_total", (("source", "api"),))] = api
    return figures


def _scrape_without_history(app: App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape a freshly started web app over `app`'s state, and view its page; fail if
    either read the archive."""
    app.settings.operator_key = KEY
    with served(build_app(app.settings)) as url:  # a new process's view: no caches
        session, _ = _sign_in(url)
        samples, opened = _opened_during(lambda: _samples(url))
        page, page_opened = _opened_during(lambda: session.get(f"{url}/operator", timeout=30))
    assert page.status_code == 200 and "Service health" in page.text
    opened += page_opened
    if app.store.flags() is None:  # the TinyDB engine's files (a database has no archive)
        assert any(path.endswith("index.json") for path in opened)  # the hook does see reads
        archive = str(app.settings.state_path / "archive")
        assert [path for path in opened if path.startswith(archive)] == []
    return samples


def test_a_scrape_reads_no_archived_history_and_matches_the_store_after_restarts(
    app: App, forge: SandboxForge, funded: str
) -> None:
    app.settings.metrics_per_client = True
    _archive_finished(app, forge, funded, 3, ["eval-pass", "eval-fail"])
    app.intake.submit_batch(funded, tasks(1))
    assert app.store.count_batches() == {"emitted": 3, "running": 1}
    assert len(app.store.list_batches(live_only=True)) == 1  # three archived

    expected = _store_figures(app)
    assert expected[("dropbox_eval_tasks", (("status", "passed"),))] == 3
    charged = ("dropbox_eval_credits_charged_total", (("client", funded),))
    assert expected[charged] == 6 * app.settings.task_price > 0
    samples = _scrape_without_history(app)
    assert {name: samples[name] for name in expected} == expected


@pytest.mark.tinydb_files
def test_a_state_from_before_the_running_totals_is_summed_once(
    app: App, forge: SandboxForge, funded: str
) -> None:
    app.settings.metrics_per_client = True
    _archive_finished(app, forge, funded, 2, ["eval-pass", "eval-pass"])
    index_path = app.settings.state_path / "index.json"
    index = json.loads(index_path.read_text())
    del index["counts"]["1"]["totals"]  # as a version without them left it ...
    index["counts"]["1"]["all"] = {"emitted": 5}  # ... with status counts gone wrong
    write_atomically(index_path, json.dumps(index))
    expected = _store_figures(app)

    with served(build_app(app.settings)) as url:
        first = _samples(url)  # sums the archive once and keeps the totals
    assert {name: first[name] for name in expected} == expected
    assert expected[("dropbox_eval_tasks", (("status", "passed"),))] == 4
    assert app.store.count_batches() == {"emitted": 2}  # summed again from the archive
    again = _scrape_without_history(app)
    assert {name: again[name] for name in expected} == expected


def test_rejection_counts_survive_rotation_and_start_from_the_kept_lines(tmp_path: Path) -> None:
    from dropbox_eval.protocol.rejections import RejectionLog

    old = RejectionLog(tmp_path, max_bytes=200)
    for n in range(2):
        old.append({"reason": "invalid_json", "message": "x", "file": f"a{n}.json"})
    old.counts_path.unlink()  # a folder from before the counts were kept
    log = RejectionLog(tmp_path, max_bytes=200)
    assert log.counts() == {"invalid_json": 2}  # counted from the kept lines, once
    for n in range(8):
        log.append({"reason": "too_large", "message": "y" * 40, "file": f"b{n}.json"})
    assert len(log.recent(100)) < 10  # the lines rotated away ...
    assert log.counts() == {"invalid_json": 2, "too_large": 8}  # ... the counts did not
    assert RejectionLog(tmp_path).counts() == {"invalid_json": 2, "too_large": 8}
