"""`dropbox-eval check` tells what needs a person: a report whose delivery was given up, a
batch held past its deadline, a worker of the running service down. Each makes `check`
exit 1 with one line naming it and the command that resolves it; `--json` lists it under
`attention`; once resolved, `check` exits 0 again."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Receiver, isolated_cli, serving, settings_on, tasks, wait_for
from filelock import FileLock
from helpers import finish_issues

from dropbox_eval.app import App, build_app
from dropbox_eval.errors import DeliveryError
from dropbox_eval.models import BatchStatus, utcnow
from dropbox_eval.ops.attention import INBOX_GRACE, START_SERVICE, inbox_missing, workers_down
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.servicestate import running_status
from dropbox_eval.util.timestamps import parse
from dropbox_eval.views.service import service_view

MAX_ATTEMPTS = 2


@pytest.fixture
def world(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> tuple[App, Cli]:
    """The state folder, written in-process by `app` and checked by the real command line
    with the same settings."""
    cli = isolated_cli(tmp_path, forge, monkeypatch)
    monkeypatch.setenv("SAAS_EVAL_DELIVERY_MAX_ATTEMPTS", str(MAX_ATTEMPTS))
    monkeypatch.setenv("SAAS_EVAL_CALLBACK_ALLOW", "127.0.0.1")
    settings = settings_on(
        forge,
        tmp_path,
        poll_interval=0.2,
        settle_seconds=0,
        callback_allow="127.0.0.1",
        delivery_max_attempts=MAX_ATTEMPTS,
        delivery_retry_base=0.01,
    )
    app = build_app(settings)
    app.billing.add_client("acme", 100)
    return app, cli


def _finished(app: App, forge: SandboxForge, callback_url: str | None = None) -> str:
    """A batch whose every task the lane finished, polled: its report is due."""
    batch_id = str(app.intake.submit_batch("acme", tasks(2), callback_url=callback_url)["batch_id"])
    finish_issues(forge, app.store.get_batch(batch_id).repo)
    app.poller.poll_completed(batch_id)
    assert app.store.get_batch(batch_id).status == BatchStatus.COMPLETED
    return batch_id


def _check(cli: Cli) -> tuple[int, str, dict[str, Any]]:
    """`check`'s exit code and text, and its `--json` document."""
    text = cli("check")
    as_json = cli("check", "--json")
    assert text.exit_code == as_json.exit_code, (text.output, as_json.output)
    return text.exit_code, text.stdout, json.loads(as_json.stdout)


def test_a_given_up_delivery_needs_a_person_until_it_is_re_sent(
    world: tuple[App, Cli], forge: SandboxForge, receiver: Receiver
) -> None:
    app, cli = world
    receiver.answers = [503] * (MAX_ATTEMPTS + 1)  # it refuses every automatic try
    batch_id = _finished(app, forge, callback_url=receiver.url)
    code, text, _ = _check(cli)
    assert code == 0, text  # a due report is the service's work
    assert "nothing needs a person" in text

    with pytest.raises(DeliveryError, match="attempt 1 of 2 failed"):
        app.delivery.deliver_due(batch_id)  # the delivery worker's automatic try
    code, text, _ = _check(cli)
    assert code == 0, text  # retrying: still the service's work
    assert wait_for(lambda: app.delivery.is_due(app.store.get_batch(batch_id)))
    with pytest.raises(DeliveryError, match="no automatic try left"):
        app.delivery.deliver_due(batch_id)
    assert (app.settings.outbox_path / "undelivered" / f"{batch_id}.json").exists()

    code, text, document = _check(cli)
    assert code == 1, text
    lines = [line for line in text.splitlines() if line.startswith("needs a person:")]
    assert len(lines) == 1, text
    assert batch_id in lines[0] and f"dropbox-eval emit {batch_id} --force" in lines[0]
    assert document["ok"] is False and document["findings"] == []
    [item] = document["attention"]
    assert item == {
        "kind": "delivery_given_up",
        "batch_id": batch_id,
        "client_id": "acme",
        "worker": None,
        "message": item["message"],
        "action": f"dropbox-eval emit {batch_id} --force",
    }
    assert "503" in item["message"]

    receiver.answers = []  # the client fixed its endpoint
    sent = cli("emit", batch_id, "--force")
    assert sent.exit_code == 0, sent.output
    code, text, document = _check(cli)
    assert code == 0, text
    assert document["attention"] == [] and document["ok"] is True
    assert len(receiver.received) == MAX_ATTEMPTS + 1


def test_a_batch_held_past_its_deadline_needs_a_person_until_the_service_ends_it(
    world: tuple[App, Cli],
) -> None:
    app, cli = world
    batch_id = str(app.intake.submit_batch("acme", tasks(1))["batch_id"])
    app.store.update_batch(batch_id, deadline=utcnow() - timedelta(minutes=1))
    code, text, _ = _check(cli)
    assert code == 0, text  # just past it: the service's next visit expires it

    app.store.update_batch(batch_id, deadline=utcnow() - timedelta(hours=2))  # no service ran
    code, text, document = _check(cli)
    assert code == 1, text
    [line] = [line for line in text.splitlines() if line.startswith("needs a person:")]
    assert batch_id in line and "no service runs" in line and "dropbox-eval run" in line
    [item] = document["attention"]
    assert (item["kind"], item["batch_id"], item["client_id"], item["action"]) == (
        "batch_overdue",
        batch_id,
        "acme",
        "dropbox-eval run",
    )
    with FileLock(str(app.settings.state_path / "service.lock")):  # a service that is stuck
        code, text, document = _check(cli)
    assert code == 1, text
    assert [item["action"] for item in document["attention"]] == [f"dropbox-eval cancel {batch_id}"]

    assert cli("pause").exit_code == 0
    code, text, document = _check(cli)
    assert code == 1, text
    assert [item["action"] for item in document["attention"]] == ["dropbox-eval resume"]
    assert cli("resume").exit_code == 0

    with serving(app):
        assert wait_for(lambda: _status(cli, batch_id) == BatchStatus.EXPIRED)
        code, text, document = _check(cli)  # beside the running service
    assert code == 0, text
    assert document == {"ok": True, "findings": [], "attention": [], "repaired": False}


def _status(cli: Cli, batch_id: str) -> str:
    shown = cli("batch", batch_id, "--json")
    return str(json.loads(shown.stdout)["status"]) if shown.exit_code == 0 else ""


def test_a_worker_down_is_read_from_the_running_service_status(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    since = "2024-05-01T10:00:00Z"
    workers = {
        "inbox-worker": {"state": "waiting", "restarts": 0, "last_error": None,
                         "detail": "the inbox folder is missing", "since": since},
        "forge-worker": {"state": "restarting", "restarts": 3, "last_error": "boom",
                         "detail": None, "since": since},
        "delivery-worker": {"state": "failed", "restarts": 5, "last_error": "disk full",
                            "detail": None, "since": since},
    }  # fmt: skip
    (state / "service.json").write_text(json.dumps({"state": "running", "workers": workers}))
    assert running_status(state) is None  # no service runs
    stopped = workers_down(service_view(state))  # only the one that stopped it
    assert [(item.kind, item.worker) for item in stopped] == [("worker_down", "delivery-worker")]
    assert "it stopped the service" in stopped[0].message
    assert stopped[0].action == START_SERVICE and "systemctl restart" in START_SERVICE

    with FileLock(str(state / "service.lock")):  # a service runs
        down = workers_down(running_status(state))
        missing = inbox_missing(running_status(state), utcnow())
        assert inbox_missing(running_status(state), parse(since) + INBOX_GRACE / 2) == []
    assert inbox_missing(running_status(state), utcnow()) == []  # no service: DropboxEvalDown
    assert [(item.kind, item.worker) for item in missing] == [("inbox_missing", "inbox-worker")]
    assert "the inbox folder is missing for " in missing[0].message
    assert "mount the share" in missing[0].action
    assert [(item.kind, item.worker) for item in down] == [
        ("worker_down", "delivery-worker"),
        ("worker_down", "forge-worker"),
    ]
    assert "restarting" in down[1].message and "boom" in down[1].message
    assert "3 restart(s)" in down[1].message
    assert "failed" in down[0].message and "disk full" in down[0].message
    assert (down[0].action, down[1].action) == (START_SERVICE, "dropbox-eval status")
