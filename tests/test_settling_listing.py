"""Settling issues listed, not read one by one (results/settlelisting.py): the same results
as the per-issue reads on the same forge history, and a visit's requests grow with the
listing's pages, not with the settling tasks (only each due issue's timeline stays one
read per issue). The sandbox forge runs on a manual clock: every service looks at the
forge at the same instants, so the two routes see one history."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import fixed_report
from histories import HISTORIES, early, late, reported
from history_model import HUMAN, effective, outcomes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_client import new_api
from test_forge_history import SETTLE, _app, _batch, _clock
from test_result_property import (
    MOMENTS,
    TASKS,
    Scenario,
    Stage,
    _outcome,
    _service,
    histories,
)
from test_settle_moment import Mode, _play, _runs

from dropbox_eval.app import App
from dropbox_eval.models import BatchStatus, TaskStatus
from dropbox_eval.sandbox import ManualClock, SandboxForge


@pytest.fixture
def forge() -> Iterator[SandboxForge]:
    """A sandbox forge on a manual clock."""
    with SandboxForge(port=0, clock=ManualClock()) as running:
        yield running


def _issue_gets(forge: SandboxForge, repo: str) -> int:
    """GETs of single issues of `repo` (not their timelines) in the forge's log."""
    prefix = f"/api/v1/repos/{repo}/issues/"
    return sum(
        1
        for r in forge.requests
        if r.method == "GET" and r.path.startswith(prefix) and r.path[len(prefix) :].isdigit()
    )


def test_the_seventeen_histories_read_alike_listed_and_one_by_one(
    forge: SandboxForge,
    tmp_path: Path,
) -> None:
    modes = {
        f"{every} s, {route}": Mode(every, hooked=False, reads_late=every > 1)
        for every in (1, 30)
        for route in ("listed", "one by one")
    }
    with _runs(forge, tmp_path, modes, len(HISTORIES)) as runs:
        for name, run in runs.items():
            run.app.poller.listing.mode = "always" if name.endswith("listed") else "never"
        _play(forge, list(runs.values()), HISTORIES)
    rows = {name: [reported(r) for r in run.results()] for name, run in runs.items()}
    for every in (1, 30):
        listed, single = rows[f"{every} s, listed"], rows[f"{every} s, one by one"]
        assert listed == single
        pick = late if every > 1 else early
        assert listed == [pick(h.row) for h in HISTORIES]
    gets = {name: _issue_gets(forge, run.repo) for name, run in runs.items()}
    assert gets["1 s, listed"] == gets["30 s, listed"] == 0, gets  # both routes were taken
    assert gets["1 s, one by one"] > 0, gets


# -- the two routes on generated histories ---------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(
    st.tuples(histories(), histories()),
    st.lists(MOMENTS, max_size=5).map(sorted),
)
def test_generated_histories_read_alike_listed_and_one_by_one(
    steps: tuple[list[Any], list[Any]], polls: list[float]
) -> None:
    """Two services polling at the same instants, one listing its settling issues, one
    reading them one by one: the same report, and one the history allows."""
    stories = [effective(list(s)) for s in steps]
    scenario = Scenario(steps, a_polls=polls, b_polls=polls, b_at_once=False)
    with tempfile.TemporaryDirectory() as home, SandboxForge(port=0, clock=ManualClock()) as hub:
        hub.state.add_user(HUMAN)
        listed = _service(hub, Path(home, "listed"), [TASKS])
        single = _service(hub, Path(home, "single"), [TASKS])
        listed.app.poller.listing.mode = "always"
        single.app.poller.listing.mode = "never"
        try:
            stage = _stage(hub, listed, single)
            stage.play(stories, scenario)
            got = []
            for service, side in ((listed, 0), (single, 1)):
                report = fixed_report(service.app.store, service.batches[0])
                assert report is not None
                got.append(
                    [
                        _outcome(result, stage.copies[i][side], outcomes(stories[i])[0].summary
                                 is not None)
                        for i, result in enumerate(report["results"])
                    ]
                )  # fmt: skip
        finally:
            for service in (listed, single):
                service.worker.close()
    assert got[0] == got[1], f"listed {got[0]}, one by one {got[1]}; played {steps}"
    for task, outcome in enumerate(got[0]):
        assert outcome in outcomes(stories[task]), (task, outcome, steps)


def _stage(hub: SandboxForge, first: Any, second: Any) -> Stage:
    """test_result_property's stage with two polling services, each with one batch of
    both tasks in one repo (there, A has two repos and B a webhook)."""
    stage = Stage.__new__(Stage)
    clock = hub.state.clock
    assert isinstance(clock, ManualClock)
    stage.forge, stage.a, stage.b, stage.state, stage.clock = hub, first, second, hub.state, clock
    stage.copies = [(first.copy(0, i), second.copy(0, i)) for i in range(2)]
    stage.stories, stage.scenario = [], Scenario(([], []))
    return stage


# -- what a visit costs ------------------------------------------------------------------------


def _settling_batch(forge: SandboxForge, app: App, count: int) -> tuple[str, str, list[int]]:
    """A batch of `count` tasks whose issues the lane closed at once, each one settling."""
    batch_id, repo, numbers = _batch(app, count)
    owner, name = repo.split("/")
    clock = _clock(forge)
    app.poller.poll_completed(batch_id)
    for number in numbers:
        forge.finish_issue(owner, name, number, comment=f"PASS {number}", labels=["eval-pass"])
    clock.advance(2)
    app.poller.poll_completed(batch_id)
    assert all(t.settling is not None for t in app.store.get_tasks(batch_id))
    return batch_id, repo, numbers


def _visit_cost(forge: SandboxForge, app: App, batch_id: str, repo: str) -> dict[str, int]:
    """One visit of the batch: its requests, by kind."""
    forge.clear_requests()
    app.poller.poll_completed(batch_id)
    mine = [r for r in forge.requests if r.path.startswith(f"/api/v1/repos/{repo}/")]
    return {
        "issue": _issue_gets(forge, repo),
        "timeline": sum(1 for r in mine if r.path.endswith("/timeline")),
        "listing": sum(1 for r in mine if r.path == f"/api/v1/repos/{repo}/issues"),
        "all": len(mine),
    }


@pytest.mark.parametrize("count", [30, 120])
def test_a_visit_costs_pages_not_settling_issues(
    forge: SandboxForge,
    tmp_path: Path,
    count: int,
) -> None:
    app = _app(forge, tmp_path)
    batch_id, repo, _numbers = _settling_batch(forge, app, count)
    pages = -(-count // 50)
    _clock(forge).advance(1)
    waiting = _visit_cost(forge, app, batch_id, repo)  # none due: nothing read one by one
    # the visit's own listing (one page: nothing changed), a count, the settling ones' pages
    assert waiting == {"issue": 0, "timeline": 0, "listing": pages + 2, "all": pages + 2}
    _clock(forge).advance(SETTLE)
    due = _visit_cost(forge, app, batch_id, repo)
    assert due == {"issue": 0, "timeline": count, "listing": pages + 2, "all": count + pages + 2}
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED
    results = [t.result.summary if t.result else None for t in app.store.get_tasks(batch_id)]
    assert results == [f"PASS {n}" for n in _numbers]


def test_one_by_one_a_visit_costs_a_get_per_settling_issue(
    forge: SandboxForge,
    tmp_path: Path,
) -> None:
    """The route the listing replaces, for comparison (and for a handful of tasks)."""
    app = _app(forge, tmp_path)
    app.poller.listing.mode = "never"
    batch_id, repo, _ = _settling_batch(forge, app, 30)
    _clock(forge).advance(1)
    assert _visit_cost(forge, app, batch_id, repo)["issue"] == 30


def test_a_deleted_settling_issue_is_missing_at_the_next_visit_when_listed(
    forge: SandboxForge,
    tmp_path: Path,
) -> None:
    """The listing cannot show a deleted issue: that one is read on its own, and found
    gone; the others are listed, and a reopened one goes back to running."""
    app = _app(forge, tmp_path)
    batch_id, repo, numbers = _settling_batch(forge, app, 6)
    owner, name = repo.split("/")
    forge.delete_issue(owner, name, numbers[0])
    forge.state.edit_issue(owner, name, numbers[1], state="open", doer=HUMAN)
    _clock(forge).advance(1)
    cost = _visit_cost(forge, app, batch_id, repo)
    assert cost["issue"] == 1  # the deleted one
    found = app.store.get_tasks(batch_id)
    assert found[0].status == TaskStatus.MISSING
    assert found[1].status == TaskStatus.OPEN and found[1].settling is None
    assert all(t.settling is not None for t in found[2:])
    _clock(forge).advance(SETTLE)
    app.poller.poll_completed(batch_id)
    assert [t.status for t in app.store.get_tasks(batch_id)] == [
        TaskStatus.MISSING,
        TaskStatus.OPEN,
        *[TaskStatus.PASSED] * 4,
    ]


def test_a_failed_listing_falls_back_to_one_read_each(
    forge: SandboxForge,
    tmp_path: Path,
) -> None:
    """The settling ones' count answers 500: each is read on its own, as before, and the
    visit does not fail. (The visit's changes come from a search here, so the count is
    its first request to the repo's issues listing.)"""
    app = _app(forge, tmp_path)
    batch_id, repo, numbers = _settling_batch(forge, app, 5)
    now = _clock(forge).advance(SETTLE + 1)
    forge.clear_requests()
    forge.fail_next(1, 500, path_contains=f"/repos/{repo}/issues", method="GET")
    app.poller.poll_batches([batch_id], listed=([], datetime.fromtimestamp(now, UTC)))
    listings = [r for r in forge.requests if r.path == f"/api/v1/repos/{repo}/issues"]
    assert [r.status for r in listings] == [500]
    assert _issue_gets(forge, repo) == 5
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED and batch.attempts == 0
    summaries = [t.result.summary if t.result else None for t in app.store.get_tasks(batch_id)]
    assert summaries == [f"PASS {n}" for n in numbers]


def test_the_listing_shows_each_issue_as_its_get_does(
    forge: SandboxForge,
) -> None:
    """What the listing replaces a GET with, over HTTP: Gitea renders both with
    `convert.ToAPIIssue` (ListIssues, GetIssue), so a listed issue is its GET's answer;
    `since` (inclusive, whole seconds, on `updated_at`) shows an issue closed then, and
    `X-Total-Count` of a one-item page counts what the pages hold."""
    api = new_api(forge)
    label = api.label("eval-task")
    numbers = [api.issue(labels=[label]) for _ in range(3)]
    _clock(forge).advance(5)
    closed = api.patch(f"/issues/{numbers[1]}", {"state": "closed"}).json()
    assert api.post(f"/issues/{numbers[1]}/comments", {"body": "done"}).status_code == 201
    since = closed["closed_at"]
    query = {"state": "all", "type": "issues", "labels": "eval-task", "since": since}
    counted = api.get("/issues", **query, page=1, limit=1)
    assert counted.status_code == 200 and counted.headers["X-Total-Count"] == "1"
    listed = api.get("/issues", **query, page=1, limit=50)
    assert listed.headers["X-Total-Count"] == "1" and "Link" not in listed.headers
    assert listed.json() == [api.get(f"/issues/{numbers[1]}").json()]
    everything = api.get("/issues", state="all", type="issues", page=1, limit=2)
    assert everything.headers["X-Total-Count"] == "3" and 'rel="next"' in everything.headers["Link"]
