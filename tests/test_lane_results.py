"""Results from a real lane: the pull request that closed the issue, and settling.

The sandbox's `pulls` lane (status comment, PR `Closes #N`, merge or abandon) is stepped
with `run_once(now=...)` (its thread never fires on its own) so every order of events is
reproduced exactly; settling waits on the forge's real clock, so those tests poll until
a generous deadline instead of assuming a speed.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from conftest import PATIENCE, wait_for
from helpers import fixed_report

from dropbox_eval.app import App, build_app
from dropbox_eval.config import Settings
from dropbox_eval.errors import ForgeNotFound
from dropbox_eval.forge.client import ForgeIssue, GiteaClient
from dropbox_eval.models import TaskRecord, utcnow
from dropbox_eval.sandbox import SandboxForge, SimulatedLane
from dropbox_eval.sandbox.lane_config import LaneConfig

SHA = re.compile(r"^[0-9a-f]{40}$")
TASKS = [
    {"task_id": "good", "title": "Good task", "body": "Do it."},
    {"task_id": "bad", "title": "Bad task", "body": "Do it. lane:fail"},
]


@pytest.fixture(params=["gitea", "forgejo"])
def forge(request: pytest.FixtureRequest) -> Iterator[SandboxForge]:
    """A sandbox with a `pulls` lane that acts only when a test calls `run_once`."""
    config = LaneConfig(mode="pulls", delay=0, interval=3600)
    with SandboxForge(port=0, flavor=request.param, lane=config) as running:
        yield running


def _lane(forge: SandboxForge, **changes: Any) -> SimulatedLane:
    assert forge.lane is not None
    forge.lane.configure(**changes)
    return forge.lane


def _app(settings: Settings, **changes: Any) -> App:
    app = build_app(settings.model_copy(update=changes))
    app.billing.add_client("acme", 100)
    return app


def _by_id(app: App, batch_id: str) -> dict[str, TaskRecord]:
    return {t.task_id: t for t in app.store.get_tasks(batch_id)}


def _report(app: App, batch_id: str, status: str = "completed") -> dict[str, dict[str, Any]]:
    batch = app.store.get_batch(batch_id)
    report = fixed_report(app.store, batch_id)
    assert batch.status == status and report is not None
    return {r["task_id"]: r for r in report["results"]}


def _settle(app: App, batch_id: str) -> None:
    """Poll until the batch completed (settling waits on the forge's clock)."""

    def completed() -> bool:
        app.poller.poll_completed(batch_id)
        return app.store.get_batch(batch_id).status == "completed"

    assert wait_for(completed)


def test_merged_and_abandoned_pull_requests_are_in_the_report(
    settings: Settings, forge: SandboxForge
) -> None:
    app = _app(settings)
    batch_id = app.intake.submit_batch("acme", TASKS)["batch_id"]
    owner, repo = app.store.get_batch(batch_id).repo.split("/")
    assert _lane(forge).run_once(time.time() + 1) == 4  # two pick-ups, a merge, an abandon
    forge.clear_requests()
    app.poller.poll_completed(batch_id)
    paths = [r.path.rsplit("/", 2)[-2:] for r in forge.requests]
    assert sum(1 for p in paths if p[1] == "timeline") == 2
    results = _report(app, batch_id)
    good, bad = results["good"], results["bad"]
    # one more GET, for the merged pull request only
    assert [p for p in paths if p[0] == "pulls"] == [["pulls", str(good["pull_request"]["number"])]]
    assert good["status"] == "passed" and bad["status"] == "failed"  # the labels decide
    assert good["summary"] == 'Lane verdict: PASS for "Good task".'
    assert good["details"] == {"checks": 3, "verdict": "pass"}
    pull = good["pull_request"]
    truth = requests.get(
        f"{forge.url}/api/v1/repos/{owner}/{repo}/pulls/{pull['number']}",
        headers={"Authorization": f"token {forge.token}"},
        timeout=30,
    ).json()
    assert pull["merged"] is True and SHA.match(pull["merge_commit_sha"])
    assert pull["merge_commit_sha"] == truth["merge_commit_sha"]
    assert pull["url"] == truth["html_url"] and pull["merged_at"] is not None
    assert bad["pull_request"]["merged"] is False
    assert bad["pull_request"]["merge_commit_sha"] is None
    assert bad["pull_request"]["number"] != pull["number"]


def test_without_verdict_labels_the_pull_request_decides(
    settings: Settings, forge: SandboxForge
) -> None:
    # a lane speaking only the pull-request protocol: its eval-* labels mean nothing here
    app = _app(settings, pass_label="ok", fail_label="nok", pull_details=False)
    batch_id = app.intake.submit_batch("acme", TASKS)["batch_id"]
    _lane(forge).run_once(time.time() + 1)
    forge.clear_requests()
    app.poller.poll_completed(batch_id)
    assert not [r for r in forge.requests if "/pulls/" in r.path]  # pull_details off
    results = _report(app, batch_id)
    assert results["good"]["status"] == "passed"
    assert results["good"]["pull_request"]["merged"] is True
    assert results["good"]["pull_request"]["merge_commit_sha"] is None
    assert results["bad"]["status"] == "no_verdict"
    assert results["bad"]["pull_request"]["merged"] is False
    batch = app.store.get_batch(batch_id)
    assert batch.charged == 2 * settings.task_price  # no_verdict is the lane's work too
    report = fixed_report(app.store, batch_id)
    assert report is not None and report["counts"]["no_verdict"] == 1


def test_unmerged_status_is_configurable(settings: Settings, forge: SandboxForge) -> None:
    app = _app(settings, pass_label="ok", fail_label="nok", unmerged_status="failed")
    batch_id = app.intake.submit_batch("acme", TASKS[1:])["batch_id"]
    _lane(forge).run_once(time.time() + 1)
    app.poller.poll_completed(batch_id)
    assert _report(app, batch_id)["bad"]["status"] == "failed"


def test_a_verdict_after_the_close_is_waited_for(settings: Settings, forge: SandboxForge) -> None:
    app = _app(settings, settle_seconds=3)
    batch_id = app.intake.submit_batch("acme", TASKS)["batch_id"]
    lane, now = _lane(forge, close_first=True, comment_lag=2), time.time() + 1
    lane.run_once(now)  # merged / abandoned and closed; no verdict yet
    forge.clear_requests()
    app.poller.poll_completed(batch_id)
    early = _by_id(app, batch_id)
    assert {t.status for t in early.values()} == {"open"}
    assert early["good"].settling is not None and early["bad"].settling is not None
    # nothing is read before the issue settled: what a reading says now could change
    assert early["good"].settling.status is None and early["bad"].settling.result is None
    assert not [r for r in forge.requests if r.path.endswith("/timeline")]
    lane.run_once(now + 2)  # the verdict label and comment, 2 s after the close
    forge.clear_requests()
    app.poller.poll_completed(batch_id)
    assert not [r for r in forge.requests if r.path.endswith("/timeline")]
    assert "state=all" in forge.requests[0].query  # while settling, reopens are listed
    moved = _by_id(app, batch_id)["bad"].settling
    assert moved is not None and early["bad"].settling.seen != moved.seen
    forge.clear_requests()
    app.poller.poll_completed(batch_id)  # nothing changed: only the listing
    assert [r.path.rsplit("/", 1)[-1] for r in forge.requests] == ["issues"]
    _settle(app, batch_id)
    timelines = [r for r in forge.requests if r.path.endswith("/timeline")]
    assert len(timelines) == 2  # each issue's timeline read once, at settle time
    results = _report(app, batch_id)
    assert results["bad"]["status"] == "failed"
    assert results["bad"]["summary"] == 'Lane verdict: FAIL for "Bad task".'
    assert results["good"]["summary"] == 'Lane verdict: PASS for "Good task".'
    assert SHA.match(results["good"]["pull_request"]["merge_commit_sha"])


@pytest.mark.parametrize("forge", ["gitea"], indirect=True)
def test_a_lane_on_its_own_clock_closing_first(settings: Settings, forge: SandboxForge) -> None:
    app = _app(settings, settle_seconds=4)  # > the 2 s lag, with room for busy CPUs
    lane = _lane(forge, close_first=True, comment_lag=2, delay=0.2, interval=0.1)
    lane.stop()  # the thread sleeps out the old interval: restart it on the new one
    lane.start()
    batch_id = app.intake.submit_batch("acme", TASKS)["batch_id"]
    _settle(app, batch_id)
    results = _report(app, batch_id)
    assert {k: r["status"] for k, r in results.items()} == {"good": "passed", "bad": "failed"}
    assert results["bad"]["summary"].startswith("Lane verdict: FAIL")


@pytest.mark.parametrize("forge", ["gitea"], indirect=True)
def test_reopened_before_settling_is_polled_again(settings: Settings, forge: SandboxForge) -> None:
    app = _app(settings, settle_seconds=2)
    batch_id = app.intake.submit_batch("acme", TASKS[:1])["batch_id"]
    repo = app.store.get_batch(batch_id).repo
    owner, name = repo.split("/")
    number = app.store.get_tasks(batch_id)[0].issue_number or 0
    forge.finish_issue(owner, name, number, comment="First attempt.", labels=[])
    app.poller.poll_completed(batch_id)
    first = app.store.get_tasks(batch_id)[0]
    assert first.status == "open" and first.settling is not None
    assert first.settling.status is None  # read once settled, not before
    reopened = requests.patch(
        f"{forge.url}/api/v1/repos/{repo}/issues/{number}",
        json={"state": "open"},
        headers={"Authorization": f"token {forge.token}"},
        timeout=30,
    )
    assert reopened.status_code == 201
    app.poller.poll_completed(batch_id)
    again = app.store.get_tasks(batch_id)[0]
    assert again.status == "open" and again.settling is None
    assert app.store.get_batch(batch_id).status == "running"
    forge.finish_issue(owner, name, number, comment="Second attempt.", labels=["eval-pass"])
    _settle(app, batch_id)
    result = _report(app, batch_id)["good"]
    assert (result["status"], result["summary"]) == ("passed", "Second attempt.")


def test_cancel_keeps_a_settling_result(settings: Settings, forge: SandboxForge) -> None:
    app = _app(settings, settle_seconds=600)
    batch_id = app.intake.submit_batch("acme", TASKS)["batch_id"]
    _lane(forge).run_once(time.time() + 1)
    app.poller.poll_completed(batch_id)
    assert all(t.settling is not None for t in app.store.get_tasks(batch_id))
    forge.clear_requests()
    app.lifecycle.cancel(batch_id)
    assert not [r for r in forge.requests if r.method != "GET"]  # closed issues left alone
    results = _report(app, batch_id, "cancelled")
    assert {k: r["status"] for k, r in results.items()} == {"good": "passed", "bad": "failed"}


def test_timeline_of_a_missing_issue_is_not_found(forge: SandboxForge) -> None:
    client = GiteaClient(forge.url, forge.token)
    repo = f"{forge.user}/gone"
    client.ensure_repo(repo)
    forge.clear_requests()
    gone = ForgeIssue(
        number=7, title="", state="closed", labels=[], html_url="", updated_at=utcnow()
    )
    with pytest.raises(ForgeNotFound):
        client.timeline(repo, gone)
    statuses = [(r.path.rsplit("/", 1)[-1], r.status) for r in forge.requests]
    if forge.state.flavor.name == "gitea":  # 500, confirmed by a GET: 404
        assert statuses == [("timeline", 500), ("7", 404)]
    else:
        assert statuses == [("timeline", 404)]


@pytest.mark.parametrize("forge", ["gitea"], indirect=True)
def test_each_polling_thread_keeps_its_own_listing_clock(forge: SandboxForge) -> None:
    # repos are polled in parallel on one client: one repo's listing must not move the
    # `since` (and the settle clock) of another
    client = GiteaClient(forge.url, forge.token)
    client.ensure_repo(f"{forge.user}/clock")
    client.listed_at = None
    seen: list[object] = []

    def list_elsewhere() -> None:
        list(client.iter_issues(f"{forge.user}/clock"))
        seen.append(client.listed_at)

    thread = threading.Thread(target=list_elsewhere)
    thread.start()
    thread.join(PATIENCE)
    assert seen and seen[0] is not None  # that thread saw its listing's Date
    assert client.listed_at is None  # this one did not list anything
