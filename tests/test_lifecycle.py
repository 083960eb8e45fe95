"""Holds and settlement, deadlines, cancellation, signed callbacks, callback URL policy."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Receiver, database_env, read_json, tasks
from standardwebhooks import Webhook

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.cli import main
from dropbox_eval.config import Settings
from dropbox_eval.errors import BatchRejected
from dropbox_eval.models import BatchFile, BatchStatus, TaskStatus, utcnow
from dropbox_eval.protocol.callbacks import CallbackPolicy
from dropbox_eval.sandbox import SandboxForge


def _repo(app: App, batch_id: str) -> tuple[str, str]:
    owner, name = app.store.get_batch(batch_id).repo.split("/")
    return owner, name


def _finish(
    app: App, forge: SandboxForge, batch_id: str, task_ids: list[str], label: str = "eval-pass"
) -> None:
    owner, name = _repo(app, batch_id)
    for task in app.store.get_tasks(batch_id):
        if task.task_id in task_ids:
            forge.finish_issue(owner, name, task.issue_number or 0, comment="Done.", labels=[label])


def test_hold_then_charge_only_finished_tasks(app: App, forge: SandboxForge, funded: str) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(4))["batch_id"]  # price 2: hold 8
    client = app.billing.client(funded)
    assert (client.balance, client.held, client.available) == (100, 8, 92)
    _finish(app, forge, batch_id, ["t1", "t2"])
    _finish(app, forge, batch_id, ["t3"], label="eval-fail")
    owner, name = _repo(app, batch_id)
    forge.delete_issue(owner, name, app.store.get_tasks(batch_id)[3].issue_number or 0)
    app.poller.poll_completed(batch_id, full=True)
    batch = app.store.get_batch(batch_id)
    assert (batch.status, batch.charged) == ("completed", 6)  # the missing task is free
    client = app.billing.client(funded)
    assert (client.balance, client.held) == (94, 0)
    kinds = [(e.kind, e.amount, e.held_change) for e in app.store.ledger(funded)]
    assert kinds == [("fund", 100, 0), ("hold", 0, 8), ("charge", -6, 0), ("release", 0, -8)]
    app.poller.poll_completed(batch_id)
    assert len(app.store.ledger(funded)) == 4  # settled once


def test_concurrent_batches_cannot_overdraw(app: App, funded: str) -> None:
    assert app.intake.submit_batch(funded, tasks(30))["ok"]  # holds 60 of 100
    second = app.intake.submit_batch(funded, tasks(30), batch_ref="two")
    assert second["reason"] == "unfunded" and "held" in second["message"]
    assert app.billing.client(funded).available == 40


def test_cancel_closes_open_issues_keeps_results_and_emits(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(3))["batch_id"]
    _finish(app, forge, batch_id, ["t1"])
    runner = CliRunner(env={"SAAS_EVAL_GITEA_TOKEN": forge.token, **database_env()})
    base = [
        "--home",
        str(app.settings.home),
        "--gitea-url",
        forge.url,
        "--owner",
        forge.user,
    ]
    result = runner.invoke(main, [*base, "cancel", batch_id, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "cancelled"
    owner, name = _repo(app, batch_id)
    issues = {i["number"]: i for i in forge.issues(owner, name)}
    statuses = {t.task_id: t.status for t in app.store.get_tasks(batch_id)}
    assert statuses == {"t1": "passed", "t2": "cancelled", "t3": "cancelled"}
    for task in app.store.get_tasks(batch_id)[1:]:
        issue = issues[task.issue_number or 0]
        assert issue["state"] == "closed"
        assert "eval-cancelled" in [label["name"] for label in issue["labels"]]
        assert issue["comments"] == 1
    assert app.billing.client(funded).balance == 98  # one finished task charged
    assert runner.invoke(main, [*base, "cancel", batch_id]).exit_code == 1
    service_for(app).run(once=True)
    report = read_json(app.settings.outbox_path / f"{batch_id}.json")
    assert report["status"] == "cancelled"
    assert report["counts"] == {"total": 3, "passed": 1, "failed": 0, "cancelled": 2}


def test_deadline_expires_unfinished_tasks(app: App, forge: SandboxForge, funded: str) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    _finish(app, forge, batch_id, ["t1"], label="eval-fail")
    app.store.update_batch(batch_id, deadline=utcnow() - timedelta(seconds=1))
    service_for(app).run(once=True)
    batch = app.store.get_batch(batch_id)
    assert batch.status == "expired" and batch.emitted_at is not None
    report = read_json(app.settings.outbox_path / f"{batch_id}.json")
    assert report["status"] == "expired"
    assert [r["status"] for r in report["results"]] == ["failed", "expired"]
    owner, name = _repo(app, batch_id)
    number = app.store.get_tasks(batch_id)[1].issue_number
    second = next(i for i in forge.issues(owner, name) if i["number"] == number)
    assert second["state"] == "closed"
    assert "eval-expired" in [label["name"] for label in second["labels"]]


def test_completion_window_is_checked(app: App, funded: str) -> None:
    ok = app.intake.submit_batch(funded, tasks(1))
    deadline = app.store.get_batch(ok["batch_id"]).deadline
    assert deadline is not None
    assert timedelta(hours=23, minutes=59) < deadline - utcnow() <= timedelta(hours=24)
    with pytest.raises(BatchRejected) as caught:
        app.intake.accept(
            BatchFile.model_validate(
                {"tasks": tasks(1), "completion_window": "30d", "batch_ref": "long"}
            ),
            funded,
        )
    assert caught.value.details["field"] == "completion_window"
    short = app.intake.accept(
        BatchFile.model_validate(
            {"tasks": tasks(1), "completion_window": "2h", "batch_ref": "short"}
        ),
        funded,
    )
    short_deadline = app.store.get_batch(short["batch_id"]).deadline
    assert short_deadline is not None and short_deadline - utcnow() <= timedelta(hours=2)


def test_signed_callback_verifies_with_standardwebhooks(
    app: App, forge: SandboxForge, funded: str, receiver: Receiver
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1), callback_url=receiver.url)["batch_id"]
    _finish(app, forge, batch_id, ["t1"])
    app.poller.poll_completed(batch_id)
    app.delivery.emit(batch_id)
    headers, body = receiver.received[0]
    secret = app.billing.client(funded).webhook_secret
    assert secret and secret.startswith("whsec_")
    payload = Webhook(secret).verify(body, headers)
    assert payload["batch_id"] == batch_id
    new_secret = app.billing.rotate_secret(funded)
    with pytest.raises(Exception, match="(?i)signature"):
        Webhook(new_secret).verify(body, headers)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://10.1.2.3/x",
        "http://192.168.0.5/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0/x",
        "ftp://example.com/x",
        "http://100.64.0.1/x",
        "http://[2002:7f00:1::1]/x",
        "http://192.0.2.10/x",
        "http://[fd00:ec2::254]/x",
        "http://no-such-host.invalid/x",
    ],
)
def test_callback_policy_refuses_internal_targets(url: str) -> None:
    with pytest.raises(BatchRejected) as caught:
        CallbackPolicy().check(url)
    assert caught.value.reason == "callback_refused"


def test_callback_policy_allow_list_and_public_addresses() -> None:
    CallbackPolicy().check("https://93.184.216.34/hook")
    CallbackPolicy("127.0.0.1").check("http://127.0.0.1:8000/hook")
    CallbackPolicy("10.0.0.0/8").check("http://10.2.3.4/hook")
    CallbackPolicy("localhost").check("http://localhost/hook")


def test_refused_callback_rejects_the_file(
    app: App, forge: SandboxForge, funded: str, tmp_path: Path
) -> None:
    forge.clear_requests()
    path = app.inbox.root / "cb.json"
    path.write_text(
        json.dumps(
            {"client_id": funded, "tasks": tasks(1), "callback_url": "http://169.254.169.254/hook"}
        )
    )
    outcome = app.inbox.process(path)
    assert outcome.status == "rejected"
    error = read_json(app.inbox.root / "rejected" / "cb.json.error.json")
    assert error["reason"] == "callback_refused" and error["field"] == "callback_url"
    assert forge.requests == [] and app.billing.client(funded).held == 0


def test_cancel_file_in_client_folder(app: App, forge: SandboxForge, funded: str) -> None:
    app.billing.add_client("other", 100)
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    folder = app.inbox.root / "other"
    folder.mkdir(parents=True)
    foreign = folder / f"cancel-{batch_id}.json"
    foreign.write_text("{}")
    refused = app.inbox.process(foreign)
    assert refused.status == "rejected" and refused.document["reason"] == "unknown_batch"
    assert app.store.get_batch(batch_id).status == "running"
    own = app.inbox.root / funded / f"cancel-{batch_id}.json"
    own.parent.mkdir(parents=True)
    own.write_text("")
    done = app.inbox.process(own)
    assert done.status == "accepted", done.document
    assert done.document["status"] == "cancelled"
    assert (app.inbox.root / funded / "accepted" / f"cancel-{batch_id}.json.receipt.json").exists()
    assert app.store.get_batch(batch_id).status == "cancelled"
    own.write_text("")
    forge.clear_requests()
    again = app.inbox.process(own)  # idempotent: a second cancel, or one read again after a kill
    assert again.status == "accepted" and again.document["status"] == "cancelled"
    assert forge.requests == []


def test_cancel_after_completion_changes_nothing(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    _finish(app, forge, batch_id, ["t1", "t2"])
    app.poller.poll_completed(batch_id)
    with pytest.raises(Exception, match="only running batches"):
        app.lifecycle.cancel(batch_id)
    closed_again = app.closer.close(batch_id, app.store.get_tasks(batch_id), BatchStatus.CANCELLED)
    assert closed_again.status == "completed"
    assert [e.kind for e in app.store.ledger(funded)].count("release") == 1
    assert app.billing.client(funded).held == 0


def test_expiry_ends_a_batch_whose_repo_is_gone(
    app: App, forge: SandboxForge, funded: str, settings: Settings
) -> None:
    offline = build_app(settings.model_copy(update={"gitea_url": None}))
    batch_id = offline.intake.submit_batch(funded, tasks(2))["batch_id"]  # no forge: no repo
    assert [t.status for t in app.store.get_tasks(batch_id)] == ["pending", "pending"]
    app.store.update_batch(batch_id, deadline=utcnow() - timedelta(seconds=1))
    assert app.lifecycle.end_if_due(batch_id) is True
    batch = app.store.get_batch(batch_id)
    assert (batch.status, batch.charged) == ("expired", 0)
    assert app.billing.client(funded).held == 0


def test_a_cancel_requested_batch_gets_no_new_issues(
    app: App, forge: SandboxForge, funded: str, settings: Settings
) -> None:
    offline = build_app(settings.model_copy(update={"gitea_url": None}))
    batch_id = offline.intake.submit_batch(funded, tasks(2))["batch_id"]
    app.store.update_batch(batch_id, cancel_requested=True)
    forge.clear_requests()
    assert app.intake.open_issues(batch_id) == 0
    assert forge.requests == []


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
    env = {"SAAS_EVAL_HOME": str(settings.home), "SAAS_EVAL_GITEA_URL": "", **database_env()}
    answer = runner.invoke(main, ["cancel", batch_id], env=env, catch_exceptions=False)
    assert answer.exit_code == 0, answer.output
    assert "cancel stored" in answer.output
    assert app.store.get_batch(batch_id).cancel_requested
    service_for(app).poll_cycle()
    assert app.store.get_batch(batch_id).status == BatchStatus.CANCELLED
