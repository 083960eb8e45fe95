"""The seed's six acceptance points, on the sandbox forge over loopback HTTP."""

from __future__ import annotations

import json

import pytest
from conftest import Receiver, read_json, tasks
from helpers import finish_issues

from dropbox_eval.app import App
from dropbox_eval.errors import DeliveryError, NotFinished
from dropbox_eval.forge.markers import marker
from dropbox_eval.sandbox import SandboxForge

pytestmark = pytest.mark.both_engines  # conftest.py: TinyDB and PostgreSQL

VERDICT = 'Looks good: all three checks pass.\n\nMore notes.\n\n```json\n{"score": 0.9}\n```\n'


def _repo(app: App, batch_id: str) -> tuple[str, str]:
    owner, name = app.store.get_batch(batch_id).repo.split("/")
    return owner, name


def _finish_all(app: App, forge: SandboxForge, batch_id: str, label: str = "eval-pass") -> None:
    finish_issues(forge, app.store.get_batch(batch_id).repo, label, comment=VERDICT)


def test_funded_batch_creates_one_labelled_issue_per_task(
    app: App, forge: SandboxForge, funded: str
) -> None:
    result = app.intake.submit_batch(funded, tasks(3))
    assert result["ok"] is True
    batch_id = result["batch_id"]
    owner, name = _repo(app, batch_id)
    assert name == f"eval-acme-{batch_id}"
    issues = forge.issues(owner, name)
    assert len(issues) == 3
    numbers = {i["number"] for i in issues}
    assert {i["issue_number"] for i in result["issues"]} == numbers
    for issue in issues:
        assert [label["name"] for label in issue["labels"]] == ["eval-task"]
        assert f"batch: {batch_id}" in issue["body"]
    bodies = {i["title"]: i["body"] for i in issues}
    assert marker(batch_id, "t2") in bodies["Task 2"]
    assert "- [ ] thing 2 done" in bodies["Task 2"]
    client = app.billing.client(funded)
    assert (client.balance, client.held, client.available) == (100, 6, 94)


def test_unfunded_batch_is_rejected_without_any_forge_request(
    app: App, forge: SandboxForge
) -> None:
    app.billing.add_client("poor", 1)
    forge.clear_requests()
    result = app.intake.submit_batch("poor", tasks(2))
    assert result["ok"] is False and result["reason"] == "unfunded"
    unknown = app.intake.submit_batch("nobody", tasks(1))
    assert unknown["reason"] == "unknown_client"
    assert forge.requests == []
    assert app.store.list_batches() == []
    assert app.billing.client("poor").balance == 1


def test_poll_stores_results_of_closed_issues_and_skips_open(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(3))["batch_id"]
    owner, name = _repo(app, batch_id)
    by_task = {t.task_id: t for t in app.store.get_tasks(batch_id)}
    forge.finish_issue(
        owner, name, by_task["t1"].issue_number or 0, comment=VERDICT, labels=["eval-pass"]
    )
    forge.finish_issue(
        owner,
        name,
        by_task["t2"].issue_number or 0,
        comment="Broken.\n\nstack trace",
        labels=["eval-fail"],
    )
    finished = app.poller.poll_completed(batch_id)
    assert sorted(finished) == ["t1", "t2"]
    after = {t.task_id: t for t in app.store.get_tasks(batch_id)}
    assert after["t1"].status == "passed"
    assert after["t1"].result is not None
    assert after["t1"].result.summary == "Looks good: all three checks pass."
    assert after["t1"].result.details == {"score": 0.9}
    assert after["t2"].status == "failed" and after["t2"].result is not None
    assert after["t2"].result.summary == "Broken."
    assert after["t3"].status == "open"
    batch = app.store.get_batch(batch_id)
    assert (batch.status, batch.done) == ("running", 2)


def test_closed_without_verdict_label_is_no_verdict_and_deleted_issue_is_missing(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    owner, name = _repo(app, batch_id)
    first, second = app.store.get_tasks(batch_id)
    forge.finish_issue(owner, name, first.issue_number or 0, comment=None, labels=[])
    forge.delete_issue(owner, name, second.issue_number or 0)
    app.poller.poll_completed(batch_id, full=True)
    status = {t.task_id: t.status for t in app.store.get_tasks(batch_id)}
    assert status == {"t1": "no_verdict", "t2": "missing"}
    assert app.store.get_batch(batch_id).status == "completed"


def test_emit_posts_full_report_retried_on_the_stored_schedule(
    app: App, forge: SandboxForge, funded: str, receiver: Receiver
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2), callback_url=receiver.url)["batch_id"]
    _finish_all(app, forge, batch_id)
    app.poller.poll_completed(batch_id)
    receiver.answers = [500, 500]
    for attempt in (1, 2):  # one try per visit; the record says what happens next
        with pytest.raises(DeliveryError, match=f"attempt {attempt} of 8 failed: callback"):
            app.delivery.deliver_due(batch_id)
        batch = app.store.get_batch(batch_id)
        assert batch.delivery_attempts == attempt and batch.next_delivery_at is not None
        assert batch.last_delivery_error is not None
        assert batch.last_delivery_error.startswith(f"attempt {attempt} of 8 failed")
    result = app.delivery.deliver_due(batch_id)
    assert result["ok"] is True
    assert len(receiver.received) == 3
    ids = {headers["webhook-id"] for headers, _ in receiver.received}
    assert ids == {f"msg_{batch_id}"}
    report = json.loads(receiver.received[-1][1])
    assert report["batch_id"] == batch_id and report["client_id"] == "acme"
    assert report["status"] == "completed"
    assert report["counts"] == {"total": 2, "passed": 2, "failed": 0}
    assert [r["task_id"] for r in report["results"]] == ["t1", "t2"]
    assert report["results"][0]["summary"] == "Looks good: all three checks pass."
    assert report["results"][0]["issue_url"].startswith(forge.url)
    assert not (app.settings.outbox_path / f"{batch_id}.json").exists()


def test_emit_without_callback_writes_outbox_file(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    _finish_all(app, forge, batch_id, label="eval-fail")
    app.poller.poll_completed(batch_id)
    app.delivery.emit(batch_id)
    report = read_json(app.settings.outbox_path / f"{batch_id}.json")
    assert report["counts"] == {"total": 2, "passed": 0, "failed": 2}
    assert list(app.settings.outbox_path.glob(".*.tmp")) == []


def test_batch_is_emitted_only_after_all_tasks_are_done(
    app: App, forge: SandboxForge, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    owner, name = _repo(app, batch_id)
    first = app.store.get_tasks(batch_id)[0]
    forge.finish_issue(owner, name, first.issue_number or 0, comment=VERDICT, labels=["eval-pass"])
    app.poller.poll_completed(batch_id)
    with pytest.raises(NotFinished) as early:
        app.delivery.emit(batch_id)
    assert early.value.details == {"done": 1, "total": 2}
    assert app.store.get_batch(batch_id).status == "running"
    assert not (app.settings.outbox_path / f"{batch_id}.json").exists()
    _finish_all(app, forge, batch_id)
    app.poller.poll_completed(batch_id)
    assert app.delivery.emit(batch_id)["ok"] is True
    assert app.store.get_batch(batch_id).status == "emitted"


def test_re_emit_is_idempotent_and_force_sends_identical_payload(
    app: App, forge: SandboxForge, funded: str, receiver: Receiver
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1), callback_url=receiver.url)["batch_id"]
    _finish_all(app, forge, batch_id)
    app.poller.poll_completed(batch_id)
    app.delivery.emit(batch_id)
    again = app.delivery.emit(batch_id)
    assert again["already_emitted"] is True
    assert len(receiver.received) == 1
    app.delivery.emit(batch_id, force=True)
    assert len(receiver.received) == 2
    assert receiver.received[0][1] == receiver.received[1][1]
    assert receiver.received[0][0]["webhook-id"] == receiver.received[1][0]["webhook-id"]


def test_undeliverable_report_is_kept_and_scheduled(
    app: App, forge: SandboxForge, funded: str, receiver: Receiver
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1), callback_url=receiver.url)["batch_id"]
    _finish_all(app, forge, batch_id)
    app.poller.poll_completed(batch_id)
    receiver.answers = [503, 503]
    with pytest.raises(DeliveryError, match="attempt 1 of 8 failed: callback .* answered 503"):
        app.delivery.deliver_due(batch_id)  # the delivery worker's automatic try
    batch = app.store.get_batch(batch_id)
    assert batch.status == "completed" and batch.delivery_attempts == 1
    assert batch.next_delivery_at is not None
    planned = batch.next_delivery_at
    with pytest.raises(DeliveryError, match="manual re-delivery failed: .* 503; next try at"):
        app.delivery.emit(batch_id)  # by hand: an extra try, the schedule stays
    batch = app.store.get_batch(batch_id)
    assert (batch.delivery_attempts, batch.next_delivery_at) == (1, planned)
    kept = app.settings.outbox_path / "undelivered" / f"{batch_id}.json"
    assert read_json(kept)["batch_id"] == batch_id
    app.delivery.emit(batch_id, force=True)
    assert app.store.get_batch(batch_id).status == "emitted"
    assert not kept.exists()
    assert receiver.received[0][1] == receiver.received[-1][1]


def test_interrupted_intake_resumes_without_duplicates(
    app: App, forge: SandboxForge, funded: str
) -> None:
    forge.fail_next(1, 502, path_contains="/issues")
    result = app.intake.submit_batch(funded, tasks(6))
    batch_id = result["batch_id"]
    owner, name = _repo(app, batch_id)
    before = len(forge.issues(owner, name))
    assert before < 6
    # the creates already sent when one failed landed, and were recorded, not left to adopt
    recorded_then = {t.issue_number for t in app.store.get_tasks(batch_id) if t.issue_number}
    assert recorded_then == {i["number"] for i in forge.issues(owner, name)}
    assert app.intake.open_issues(batch_id) == 6 - before
    issues = forge.issues(owner, name)
    assert len(issues) == 6
    recorded = {t.issue_number for t in app.store.get_tasks(batch_id)}
    assert recorded == {i["number"] for i in issues}
    assert app.intake.open_issues(batch_id) == 0
    assert len(forge.issues(owner, name)) == 6
