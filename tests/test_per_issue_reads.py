"""Readings are per issue, so that one broken issue never holds up its batch: one issue's
forge error delays that issue only, and a deleted issue is `missing` at the next visit of
its batch. The sandbox forge runs on a manual clock, so each history is played at exact
forge instants."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path

import pytest
from helpers import finish_issues
from test_forge_history import SETTLE, _app, _batch, _clock

from dropbox_eval.app import forge_worker
from dropbox_eval.models import BatchStatus, TaskStatus
from dropbox_eval.sandbox import ManualClock, SandboxForge


@pytest.fixture
def forge() -> Iterator[SandboxForge]:
    """A sandbox forge on a manual clock."""
    with SandboxForge(port=0, clock=ManualClock()) as running:
        yield running


def test_three_500s_on_one_timeline_delay_that_issue_only(
    forge: SandboxForge, tmp_path: Path
) -> None:
    app = _app(forge, tmp_path)
    worker = forge_worker(app, threading.Event(), lambda what, exc: None)
    batch_id, repo, numbers = _batch(app, 4)
    owner, name = repo.split("/")
    clock = _clock(forge)
    wait(worker.cycle())
    for number in numbers:
        forge.finish_issue(owner, name, number, comment=f"PASS {number}", labels=["eval-pass"])
    clock.advance(2)
    wait(worker.cycle())  # each closure listed: settling
    assert all(t.settling is not None for t in app.store.get_tasks(batch_id))
    clock.advance(SETTLE + 1)  # due; the next visit reads them without listing them again
    forge.fail_next(3, 500, path_contains=f"/issues/{numbers[0]}/timeline")
    for _ in range(3):  # each visit spends one 500 on the broken issue's timeline
        wait(worker.cycle())
        tasks = app.store.get_tasks(batch_id)
        assert tasks[0].status == TaskStatus.OPEN and tasks[0].settling is not None
        assert [t.status for t in tasks[1:]] == [TaskStatus.PASSED] * 3  # at their visit
        assert [t.result.summary for t in tasks[1:] if t.result] == [
            f"PASS {n}" for n in numbers[1:]
        ]
        assert app.store.get_batch(batch_id).attempts == 0  # no failed visit charged
    wait(worker.cycle())
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED and batch.attempts == 0
    first = app.store.get_tasks(batch_id)[0]
    assert first.status == TaskStatus.PASSED
    assert first.result is not None and first.result.summary == f"PASS {numbers[0]}"


def test_a_deleted_settling_issue_is_missing_at_the_next_visit(
    forge: SandboxForge, tmp_path: Path
) -> None:
    app = _app(forge, tmp_path)
    batch_id, repo, numbers = _batch(app, 2)
    owner, name = repo.split("/")
    clock = _clock(forge)
    finish_issues(forge, repo, comment="PASS")
    clock.advance(2)
    app.poller.poll_completed(batch_id)  # both settling
    forge.delete_issue(owner, name, numbers[0])
    clock.advance(1)  # long before the settle time ends
    app.poller.poll_completed(batch_id)
    gone, kept = app.store.get_tasks(batch_id)
    assert gone.status == TaskStatus.MISSING and gone.settling is None
    assert kept.status == TaskStatus.OPEN and kept.settling is not None
    assert app.store.get_batch(batch_id).settling_tasks == 1
    clock.advance(SETTLE)
    app.poller.poll_completed(batch_id)
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED
    assert [t.status for t in app.store.get_tasks(batch_id)] == [
        TaskStatus.MISSING,
        TaskStatus.PASSED,
    ]


def test_the_status_comes_from_the_settle_read_not_from_the_listing_before(
    forge: SandboxForge, tmp_path: Path
) -> None:
    """A verdict label taken off within the settle time after the listing saw it: the
    status comes from the timeline the settle read fetched, not the listing's labels."""
    app = _app(forge, tmp_path)
    batch_id, repo, (number,) = _batch(app)
    owner, name = repo.split("/")
    clock = _clock(forge)
    forge.finish_issue(owner, name, number, comment="PASS", labels=["eval-pass"])
    clock.advance(2)
    app.poller.poll_completed(batch_id)  # settling, listed with `eval-pass`
    clock.advance(1)
    label = next(
        lb for lb in forge.state.issue_labels(owner, name, number) if lb["name"] == "eval-pass"
    )
    forge.state.remove_issue_label(owner, name, number, label["id"])
    clock.advance(SETTLE + 1)
    app.poller.poll_completed(batch_id)
    task = app.store.get_tasks(batch_id)[0]
    assert task.status == TaskStatus.NO_VERDICT
