"""Polling as the backstop: one search per idle cycle however many repos are live."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from conftest import tasks, wait_for

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.config import Settings
from dropbox_eval.models import TaskStatus
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service

pytestmark = pytest.mark.both_engines  # conftest.py: TinyDB and PostgreSQL


def _calls(forge: SandboxForge) -> list[str]:
    return [f"{r.method} {r.path.split('/api/v1')[1]}" for r in forge.requests]


def _start(settings: Settings, forge: SandboxForge, batches: int) -> tuple[App, Service, list[str]]:
    app = build_app(settings.model_copy(update={"full_poll_every": 3}))
    app.billing.add_client("acme", 1000)
    ids = [
        app.intake.submit_batch("acme", tasks(3), batch_ref=f"b{n}")["batch_id"]
        for n in range(batches)
    ]
    service = service_for(app)
    service.poll_cycle()  # cycle 1 (full): every repo is listed once
    return app, service, ids


def _close(app: App, forge: SandboxForge, batch_id: str, task: int, label: str) -> None:
    repo = app.store.get_batch(batch_id).repo.split("/", 1)[1]
    number = app.store.get_tasks(batch_id)[task].issue_number or 0
    forge.finish_issue(forge.user, repo, number, comment="verdict", labels=[label])


def test_an_idle_cycle_is_one_search_and_closures_cost_no_listing(
    settings: Settings, forge: SandboxForge
) -> None:
    app, service, ids = _start(settings, forge, 6)
    forge.clear_requests()
    service.poll_cycle()  # cycle 2: nothing changed
    assert _calls(forge) == ["GET /repos/issues/search"]
    _close(app, forge, ids[1], 0, "eval-pass")
    _close(app, forge, ids[4], 2, "eval-fail")
    forge.clear_requests()
    service.poll_cycle()  # cycle 3: the search and two timelines, no listing
    calls = _calls(forge)
    assert calls[0] == "GET /repos/issues/search"
    assert sorted(c.rsplit("/", 1)[-1] for c in calls[1:]) == ["timeline", "timeline"]
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.PASSED
    assert app.store.get_tasks(ids[4])[2].status == TaskStatus.FAILED
    forge.clear_requests()
    service.poll_cycle()  # cycle 4 (full): nothing vanished: the counts alone
    once = "GET /users/eval"  # the owner's id, looked up once per process
    assert [c for c in _calls(forge) if c != once] == ["GET /repos/search"]
    _close(app, forge, ids[2], 1, "eval-pass")
    forge.clear_requests()
    service.poll_cycle()  # cycle 5: the search window starts where cycle 3's ended
    assert _calls(forge)[0] == "GET /repos/issues/search"
    assert app.store.get_tasks(ids[2])[1].status == TaskStatus.PASSED


def test_closures_the_search_missed_cost_the_full_cycle_one_listing_per_repo(
    settings: Settings, forge: SandboxForge
) -> None:
    app, service, ids = _start(settings, forge, 5)
    forge.state.indexer_lag = 3600  # the search never sees these closures
    _close(app, forge, ids[1], 0, "eval-pass")
    _close(app, forge, ids[3], 2, "eval-fail")
    service.poll_cycle()  # cycles 2 and 3: the search shows nothing
    service.poll_cycle()
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.OPEN
    forge.clear_requests()
    service.poll_cycle()  # cycle 4 (full): two repos count one open issue fewer
    calls = [c for c in _calls(forge) if c != "GET /users/eval"]
    assert calls[0] == "GET /repos/search"
    repos = {app.store.get_batch(ids[n]).repo for n in (1, 3)}
    assert sorted(c for c in calls[1:] if c.endswith("/issues")) == sorted(
        f"GET /repos/{repo}/issues" for repo in repos
    )  # one incremental listing per repo whose count changed, no full listing
    assert len(calls) == 1 + 2 + 2  # counts, two listings, two timelines
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.PASSED
    assert app.store.get_tasks(ids[3])[2].status == TaskStatus.FAILED


def test_a_deleted_issue_is_found_by_the_full_cycle_s_counts(
    settings: Settings, forge: SandboxForge
) -> None:
    app, service, ids = _start(settings, forge, 4)
    victim = app.store.get_tasks(ids[2])[1]
    forge.delete_issue(forge.user, victim.repo.split("/", 1)[1], victim.issue_number or 0)
    service.poll_cycle()  # cycles 2 and 3: the search cannot see a deletion
    service.poll_cycle()
    assert app.store.get_tasks(ids[2])[1].status == TaskStatus.OPEN
    forge.clear_requests()
    service.poll_cycle()  # cycle 4 (full): one repo counts one issue fewer
    listed = {c for c in _calls(forge) if c.endswith("/issues")}
    assert listed == {f"GET /repos/{victim.repo}/issues"}  # that repo alone is listed
    assert app.store.get_tasks(ids[2])[1].status == TaskStatus.MISSING


def test_a_change_the_indexer_had_not_seen_yet_is_found_by_the_next_search(
    settings: Settings, forge: SandboxForge
) -> None:
    app, service, ids = _start(settings, forge, 2)
    forge.state.indexer_lag = 3600.0  # the indexer is behind for as long as this test needs
    _close(app, forge, ids[0], 0, "eval-pass")
    forge.clear_requests()
    service.poll_cycle()  # the search does not show the close yet
    assert _calls(forge) == ["GET /repos/issues/search"], _calls(forge)
    assert app.store.get_tasks(ids[0])[0].status == TaskStatus.OPEN
    forge.state.indexer_lag = 0.0  # ... and now it has caught up

    def found() -> bool:
        service.poll_cycle()
        return app.store.get_tasks(ids[0])[0].status == TaskStatus.PASSED

    assert wait_for(found)


def test_a_closure_whose_read_failed_is_listed_once_the_search_window_passed_it(
    settings: Settings, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dropbox_eval.results.scout.SEARCH_OVERLAP", timedelta(0))  # no second look
    app, service, ids = _start(settings, forge, 3)
    for _ in range(3):  # cycles 2 and 3 search, cycle 4 is full
        service.poll_cycle()
    _close(app, forge, ids[1], 0, "eval-pass")
    number = app.store.get_tasks(ids[1])[0].issue_number
    forge.fail_next(20, 502, path_contains=f"/issues/{number}/timeline")
    time.sleep(1.1)  # the forge's clock moves on: the next search starts after the closure
    service.poll_cycle()  # cycle 5: the search shows it, reading its result fails
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.OPEN
    forge.state.faults.clear()
    time.sleep(1.1)
    service.poll_cycle()  # cycle 6: the search's window no longer holds the closure
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.PASSED


def test_batches_recorded_after_a_search_are_seen_by_the_next_search_not_a_listing_each(
    settings: Settings, forge: SandboxForge
) -> None:
    """A burst of new batches (recorded with their issues after the last plan read the
    batches) costs the next cycle's search, not a listing per new repo; their closes are
    read all the same."""
    app, service, ids = _start(settings, forge, 3)
    service.poll_cycle()  # cycle 2: a search plan that read the three batches
    new = [
        app.intake.submit_batch("acme", tasks(2), batch_ref=f"new{n}")["batch_id"] for n in range(4)
    ]
    assert all(app.store.get_batch(b).intake_done for b in new)
    _close(app, forge, new[1], 0, "eval-pass")
    _close(app, forge, new[3], 1, "eval-fail")
    forge.clear_requests()
    service.poll_cycle()  # cycle 3: one search shows the two closes; no listing at all
    calls = _calls(forge)
    assert calls[0] == "GET /repos/issues/search"
    assert not [c for c in calls if c.endswith("/issues")], calls
    assert app.store.get_tasks(new[1])[0].status == TaskStatus.PASSED
    assert app.store.get_tasks(new[3])[1].status == TaskStatus.FAILED
    assert app.store.get_tasks(new[0])[0].status == TaskStatus.OPEN
