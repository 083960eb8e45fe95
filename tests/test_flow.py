"""Many clients, one forge: the receipt when the batch is durable, one client's flood never
standing before another's first request, and no tick on the hot paths. Black-box: files in
the inbox of a running service, the sandbox forge over loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import read_json, running, serving, settings_on, tasks, wait_for
from helpers import drop, finish_issues, receipt_of

from dropbox_eval import workers
from dropbox_eval.app import App, build_app, build_service
from dropbox_eval.models import BatchStatus
from dropbox_eval.sandbox import SandboxForge


def drop_batch(app: App, client: str, name: str, document: dict[str, Any]) -> Path:
    """Drop a batch in `client`'s folder; where its receipt will be."""
    return receipt_of(drop(app.settings.inbox_path, name, document, client))


def created(forge: SandboxForge, client: str) -> int:
    """Issues the forge holds in `client`'s repos."""
    repos = [n for _o, n in list(forge.state.repos) if n.startswith(f"eval-{client}-")]
    return sum(len(forge.issues(forge.user, repo)) for repo in repos)


def test_a_large_batch_gets_its_receipt_while_its_issues_are_created(
    tmp_path: Path, forge: SandboxForge
) -> None:
    app = build_app(settings_on(forge, tmp_path, quiet_period=0.1, task_price=1))
    app.billing.add_client("acme", 1000)
    forge.set_delay(5.0)  # every forge answer takes 5 s: the intake cannot wait for them
    with serving(app):
        receipt_path = drop_batch(app, "acme", "big.json", {"tasks": tasks(300)})
        assert wait_for(receipt_path.exists, 60)
        receipt = read_json(receipt_path)
        assert created(forge, "acme") < 300  # the receipt came first
        assert (receipt["status"], receipt["task_count"], receipt["held"]) == (
            "in_progress",
            300,
            300,
        )
        assert app.billing.client("acme").held == 300  # durable, with its hold
        forge.set_delay(0)
        batch_id = receipt["batch_id"]

        def opened() -> bool:
            return all(t.issue_number for t in app.store.get_tasks(batch_id))

        assert wait_for(opened, 120)
    assert created(forge, "acme") == 300  # each task once
    numbers = {t.issue_number for t in app.store.get_tasks(batch_id)}
    assert len(numbers) == 300


def test_one_clients_flood_never_stands_before_anothers_first_drop(
    tmp_path: Path, forge: SandboxForge
) -> None:
    settings = settings_on(
        forge,
        tmp_path,
        quiet_period=0.1,
        task_price=1,
        intake_concurrency=2,
        forge_max_inflight=2,  # a budget of 2 that cannot grow: the flood alone fills it
    )
    app = build_app(settings)
    app.billing.add_client("flood", 10_000)
    app.billing.add_client("small", 10)
    forge.set_delay(0.05)
    with serving(app):
        for n in range(4):
            drop_batch(app, "flood", f"f{n}.json", {"batch_ref": f"f{n}", "tasks": tasks(150)})
        assert wait_for(lambda: created(forge, "flood") >= 10, 60)  # the flood is going
        receipt_path = drop_batch(app, "small", "one.json", {"tasks": tasks(1)})
        assert wait_for(receipt_path.exists, 60)
        assert wait_for(lambda: created(forge, "small") == 1, 60)
        flood_then = created(forge, "flood")
        assert flood_then < 600  # the small client's issue came while the flood was pending
        assert wait_for(lambda: created(forge, "flood") == 600, 180)
    # its issue waited behind at most a turn of the flood's, not behind the flood's backlog
    small_at = _position_of_first_create(forge, "eval-small-")
    flood_creates = [r for r in forge.requests if _is_create(r.method, r.path, "eval-flood-")]
    assert small_at is not None and small_at < len(flood_creates) / 2, (small_at, flood_then)


def _is_create(method: str, path: str, repo: str) -> bool:
    return method == "POST" and repo in path and path.endswith("/issues")


def _position_of_first_create(forge: SandboxForge, repo: str) -> int | None:
    """How many of the flood's creates were answered before the small client's."""
    flood = 0
    for request in forge.requests:
        if _is_create(request.method, request.path, repo):
            return flood
        if _is_create(request.method, request.path, "eval-flood-"):
            flood += 1
    return None


def opened_batch(app: App, count: int) -> str:
    """Drop a batch of `count` tasks for acme; its id once all its issues exist."""
    receipt_path = drop_batch(app, "acme", "b.json", {"tasks": tasks(count)})
    assert wait_for(receipt_path.exists, 60)
    batch_id = str(read_json(receipt_path)["batch_id"])
    assert wait_for(lambda: all(t.issue_number for t in app.store.get_tasks(batch_id)), 60)
    return batch_id


@pytest.fixture
def no_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers whose periodic passes are an hour apart: only events move a batch."""
    monkeypatch.setattr(workers.delivery, "TICK_SECONDS", 3600.0)


def test_a_batch_that_ends_is_delivered_without_waiting_for_a_tick(
    tmp_path: Path, forge: SandboxForge, no_ticks: None
) -> None:
    app = build_app(
        settings_on(forge, tmp_path, quiet_period=0.1, poll_interval=0.2, settle_seconds=0)
    )
    app.billing.add_client("acme", 100)
    with serving(app):
        batch_id = opened_batch(app, 2)
        finish_issues(forge, app.store.get_batch(batch_id).repo)
        report = app.settings.outbox_path / f"{batch_id}.json"
        assert wait_for(report.exists, 60)  # the hour-long tick never came
    assert app.store.get_batch(batch_id).status == BatchStatus.EMITTED


def test_a_settling_result_becomes_final_when_its_window_ends_not_at_the_next_poll(
    tmp_path: Path, forge: SandboxForge, no_ticks: None
) -> None:
    app, service = build_service(
        settings_on(forge, tmp_path, quiet_period=0.1, poll_interval=3600.0, settle_seconds=4.0)
    )
    app.billing.add_client("acme", 100)
    with running(service):
        alarms: list[float] = []
        wired = app.poller.on_settling
        assert wired is not None

        def alarm(repo: str, seconds: float) -> None:
            alarms.append(seconds)
            wired(repo, seconds)

        app.poller.on_settling = alarm
        batch_id = opened_batch(app, 1)
        batch = app.store.get_batch(batch_id)
        (task,) = app.store.get_tasks(batch_id)
        forge.finish_issue(
            forge.user,
            batch.repo.split("/")[1],
            task.issue_number or 0,
            comment="ok",
            labels=["eval-pass"],
        )
        cycles = service.cycles
        app.nudges.add(batch.repo)  # what a forge webhook does: visit the repo now
        report = app.settings.outbox_path / f"{batch_id}.json"
        assert wait_for(report.exists, 60)
        assert service.cycles == cycles  # no poll cycle came: the alarm did it
        assert alarms and alarms[0] > 0  # read while settling, an alarm set for its end
    assert read_json(report)["results"][0]["status"] == "passed"


def opened_after_a_fault(forge: SandboxForge, tmp_path: Path, status: int) -> tuple[App, str]:
    """A 3-task drop whose first create answers `status`, with polls an hour apart: the
    app and batch once its issues exist, asserting that no poll cycle brought them."""
    app = build_app(
        settings_on(forge, tmp_path, quiet_period=0.1, poll_interval=3600.0, retry_base=0.5)
    )
    app.billing.add_client("acme", 100)
    with serving(app) as service:
        assert wait_for(lambda: service.cycles >= 1, 60)  # the start's cycle is behind us
        cycles = service.cycles
        forge.fail_next(1, status, path_contains="/issues", method="POST")
        receipt_path = drop_batch(app, "acme", "b.json", {"tasks": tasks(3)})
        assert wait_for(receipt_path.exists, 60)
        batch_id = str(read_json(receipt_path)["batch_id"])
        assert wait_for(lambda: app.store.get_batch(batch_id).intake_done, 60)
        assert service.cycles == cycles  # no poll cycle came: the stored retry instant did
    faulted = [r for r in forge.requests if r.method == "POST" and r.status == status]
    assert len(faulted) == 1 and faulted[0].path.endswith("/issues")  # the try that failed
    repo = app.store.get_batch(batch_id).repo.split("/")[1]
    assert all(t.issue_number for t in app.store.get_tasks(batch_id))
    assert len(forge.issues(forge.user, repo)) == 3  # the failed create made nothing twice
    return app, batch_id


def listed(forge: SandboxForge, app: App, batch_id: str) -> bool:
    """Whether the batch's repo was listed (an adoption pages through it)."""
    repo = app.store.get_batch(batch_id).repo
    return any(r.method == "GET" and r.path.endswith(f"{repo}/issues") for r in forge.requests)


def test_an_opening_stopped_by_a_503_comes_back_at_its_retry_instant_not_the_next_poll(
    tmp_path: Path, forge: SandboxForge
) -> None:
    app, batch_id = opened_after_a_fault(forge, tmp_path, 503)
    assert not listed(forge, app, batch_id)  # a 503 made nothing: no adoption
    assert not app.store.get_batch(batch_id).open_clean  # cleared before the next create


def test_an_opening_stopped_by_a_502_adopts_what_may_have_been_made(
    tmp_path: Path, forge: SandboxForge
) -> None:
    app, batch_id = opened_after_a_fault(forge, tmp_path, 502)
    assert listed(forge, app, batch_id)  # a 502 may hide a create: it adopts
