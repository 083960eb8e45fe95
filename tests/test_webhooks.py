"""Results by push: signed forge webhooks nudge the poller; bad deliveries change nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
import requests
from conftest import PATIENCE, tasks, wait_for

from dropbox_eval.app import App, build_app, build_service
from dropbox_eval.config import Settings
from dropbox_eval.models import TaskStatus
from dropbox_eval.results.webhooks import REPLAY_WINDOW
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api

SECRET = "hook-secret"


@pytest.fixture
def pushed(settings: Settings) -> Iterator[tuple[App, str]]:
    """An app with a webhook secret, an hour's poll interval, and its HTTP server."""
    app = build_app(
        settings.model_copy(update={"forge_webhook_secret": SECRET, "poll_interval": 3600.0})
    )
    app.billing.add_client("acme", 100)
    server = BackgroundServer(create_api(app.web), name="api")
    url = server.start()
    yield app, url
    server.stop()


def _deliver(
    url: str,
    payload: dict[str, object] | bytes,
    *,
    secret: str | None = SECRET,
    delivery: str | None = None,
    event: str = "issues",
) -> requests.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"X-Gitea-Event": event, "Content-Type": "application/json"}
    if delivery != "":  # "": sent without a delivery id
        headers["X-Gitea-Delivery"] = delivery or str(uuid.uuid4())
    if secret is not None:
        headers["X-Gitea-Signature"] = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return requests.post(f"{url}/hooks/forge", data=body, headers=headers, timeout=30)


def test_bad_deliveries_are_refused_counted_and_change_nothing(
    pushed: tuple[App, str], forge: SandboxForge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dropbox_eval")
    app, url = pushed
    batch_id = app.intake.submit_batch("acme", tasks(1))["batch_id"]
    repo = app.store.get_batch(batch_id).repo
    payload = {"action": "closed", "number": 1, "repository": {"full_name": repo}}
    assert _deliver(url, payload, secret=None).status_code == 401
    assert _deliver(url, payload, secret="wrong").status_code == 401
    other = {**payload, "repository": {"full_name": "eval/not-ours"}}
    assert _deliver(url, other).status_code == 404
    first = _deliver(url, payload, delivery="d-1")
    assert first.status_code == 202 and first.json()["outcome"] == "accepted"
    assert _deliver(url, payload, delivery="d-1").status_code == 409  # replayed
    assert dict(app.webhooks.counts) == {
        "unsigned": 1,
        "bad_signature": 1,
        "unknown_repo": 1,
        "accepted": 1,
        "replayed": 1,
    }
    assert app.nudges.take() == {repo.casefold()}  # only the good one asked for a poll
    assert app.store.get_tasks(batch_id)[0].status == TaskStatus.OPEN
    levels = {
        r.getMessage().split("(")[1].split(")")[0]: r.levelno
        for r in caplog.records
        if r.getMessage().startswith("forge webhook refused")
    }
    # a repo with no live batch is routine (late events of an ended batch): no warning
    assert levels == {
        "unsigned": logging.WARNING,
        "bad_signature": logging.WARNING,
        "unknown_repo": logging.DEBUG,
        "replayed": logging.WARNING,
    }


def test_a_closed_issue_is_stored_by_the_webhook_without_waiting_for_a_poll_cycle(
    pushed: tuple[App, str], forge: SandboxForge
) -> None:
    """The next scheduled poll cycle is an hour away and none runs meanwhile (the count of
    cycles does not move): the result can only have come through the webhook. (How soon:
    bench/latency.py.)"""
    app, service = build_service(pushed[0].settings)  # the service's parts get the hooks
    server = BackgroundServer(create_api(app.web), name="service-api")
    app.settings.forge_webhook_url = f"{server.start()}/hooks/forge"
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: bool(forge.state.hooks.listed(f"owner:{forge.user}")))
        assert wait_for(lambda: service.status.get("last_poll_at") is not None)  # cycle 1
        batch_id = app.intake.submit_batch("acme", tasks(2))["batch_id"]
        service.poll_cycle()  # the cycle that would otherwise come an hour later has run
        cycles = service.cycles
        repo = app.store.get_batch(batch_id).repo.split("/", 1)[1]
        task = app.store.get_tasks(batch_id)[0]
        forge.finish_issue(
            forge.user, repo, task.issue_number or 0, comment="ok", labels=["eval-pass"]
        )
        assert wait_for(lambda: app.store.get_tasks(batch_id)[0].status == TaskStatus.PASSED)
        assert service.cycles == cycles  # no poll cycle ran: the webhook's nudge did it
        assert app.webhooks.counts["accepted"] >= 1
    finally:
        service.stop()
        thread.join(timeout=PATIENCE)
        server.stop()


def test_replays_are_known_by_delivery_id_within_the_window_not_by_body(
    pushed: tuple[App, str], forge: SandboxForge
) -> None:
    """A label on, off and on again sends byte-identical bodies as distinct
    deliveries; each is news. The same delivery id twice is a replay; a delivery without an
    id is known by its body's digest."""
    app, url = pushed
    now = [5000.0]
    app.webhooks.clock = lambda: now[0]
    batch_id = app.intake.submit_batch("acme", tasks(1))["batch_id"]
    repo = app.store.get_batch(batch_id).repo
    payload = {"action": "label_updated", "number": 1, "repository": {"full_name": repo}}
    assert _deliver(url, payload, delivery="on").status_code == 202
    assert _deliver(url, payload, delivery="on-again").status_code == 202  # same bytes
    again = _deliver(url, payload, delivery="on")
    assert again.status_code == 409 and again.json()["outcome"] == "replayed"
    now[0] += REPLAY_WINDOW - 1
    assert _deliver(url, payload, delivery="on").status_code == 409  # still in the window
    now[0] += 2  # the window has passed: the id is forgotten
    assert _deliver(url, payload, delivery="on").status_code == 202
    assert _deliver(url, payload, delivery="").status_code == 202  # no id: its digest
    assert _deliver(url, payload, delivery="").status_code == 409
    assert _deliver(url, {**payload, "action": "closed"}, delivery="").status_code == 202
    assert app.webhooks.counts["replayed"] == 3 and app.webhooks.counts["accepted"] == 5


@pytest.mark.parametrize(
    "body",
    [
        b'{"repository": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"x": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b', "repository": {}}',
        b'{"repository": {"full_name": "o/r"}, "n": ' + b"9" * 10_000 + b"}",
        b"\xff\xfe{not utf-8",
        b"[1, 2, 3]",
        b'{"repository": "o/r"}',
        b'{"repository": {"full_name": "no-slash"}}',
        b'{"repository": {"full_name": ["o/r"]}}',
        b"",
    ],
    ids=[
        "deep-array",
        "deep-object",
        "long-number",
        "not-utf8",
        "array",
        "string",
        "no-slash",
        "list-name",
        "empty",
    ],
)
def test_a_structurally_hostile_signed_body_answers_400(
    pushed: tuple[App, str], body: bytes
) -> None:
    app, url = pushed
    answer = _deliver(url, body)
    assert answer.status_code == 400 and answer.json()["outcome"] == "bad_payload"
    assert app.webhooks.counts == {"bad_payload": 1}
    assert app.nudges.take() == set()
    assert requests.get(f"{url}/api/eval/batches", timeout=10).status_code == 401  # still up
