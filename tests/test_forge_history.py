"""One forge history, one result: a black-box test for each defect the fidelity
audit found, on the sandbox forge, which now behaves like Gitea for each. The forge runs on
a manual clock, so each history is replayed at exact forge instants and settling needs no
sleep."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests
from conftest import settings_on, tasks
from helpers import fixed_report

from dropbox_eval.app import App, build_app, forge_worker
from dropbox_eval.forge.client import GiteaClient
from dropbox_eval.models import BatchStatus, TaskStatus
from dropbox_eval.sandbox import ManualClock, SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api
from dropbox_eval.workers import ForgeWorker

SETTLE = 10
LANE, HUMAN = "lane-bot", "alice"


@pytest.fixture
def forge() -> Iterator[SandboxForge]:
    """A sandbox forge on a manual clock, with a human user besides the lane."""
    with SandboxForge(port=0, clock=ManualClock()) as running:
        running.state.add_user(HUMAN)
        yield running


def _clock(forge: SandboxForge) -> ManualClock:
    clock = forge.state.clock
    assert isinstance(clock, ManualClock)
    return clock


def _app(forge: SandboxForge, home: Path, **extra: Any) -> App:
    values: dict[str, Any] = {"settle_seconds": SETTLE, "retry_base": 0.2, **extra}
    app = build_app(settings_on(forge, home, **values))
    assert app.gitea is not None
    app.gitea.sleep = lambda _seconds: None
    app.billing.add_client("acme", 1000)
    return app


def _batch(app: App, count: int = 1) -> tuple[str, str, list[int]]:
    """A batch of `count` tasks: its id, repo and issue numbers."""
    batch_id = str(app.intake.submit_batch("acme", tasks(count))["batch_id"])
    numbers = [t.issue_number or 0 for t in app.store.get_tasks(batch_id)]
    return batch_id, app.store.get_batch(batch_id).repo, numbers


def _searching(
    forge: SandboxForge, tmp_path: Path
) -> tuple[App, ForgeWorker, list[tuple[str, str, list[int]]]]:
    """A service with two one-task batches in two repos, each listed once: from now on
    its cycles find changes with the cross-repo search."""
    app = _app(forge, tmp_path, settle_seconds=0)
    worker = forge_worker(app, threading.Event(), lambda what, exc: pytest.fail(f"{what}: {exc}"))
    batches = [_batch(app), _batch(app)]
    wait(worker.cycle())
    return app, worker, batches


def _result(app: App, batch_id: str, index: int = 0) -> dict[str, Any]:
    batch = app.store.get_batch(batch_id)
    report = fixed_report(app.store, batch_id)
    assert batch.status == BatchStatus.COMPLETED and report is not None, batch.status
    found: dict[str, Any] = report["results"][index]
    return found


def _settle(app: App, forge: SandboxForge, batch_id: str) -> None:
    """Let the settle time pass on the forge's clock and poll."""
    _clock(forge).advance(SETTLE + 1)
    app.poller.poll_completed(batch_id)


def test_a_pull_request_merged_after_a_close_by_hand_is_merged_but_not_the_closer(
    forge: SandboxForge, tmp_path: Path
) -> None:
    state, clock = forge.state, _clock(forge)
    results = []
    for seen_between in (True, False):  # a poll between the close and the merge, or none
        app = _app(forge, tmp_path / f"seen-{seen_between}")
        batch_id, repo, (number,) = _batch(app)
        owner, name = repo.split("/")
        pull = state.create_pull(
            owner, name, LANE, head="lane/1", base="main", title="Fix", body=f"Closes #{number}"
        )
        clock.advance(2)
        state.edit_issue(owner, name, number, state="closed", doer=HUMAN)
        if seen_between:
            clock.advance(1)
            app.poller.poll_completed(batch_id)
        clock.advance(3)
        state.merge_pull(owner, name, pull["number"], LANE)
        _settle(app, forge, batch_id)
        results.append(_result(app, batch_id))
    for result in results:
        assert result["status"] == "no_verdict"  # the merge closed nothing
        pull_request = result["pull_request"]
        assert pull_request["merged"] is True and pull_request["closed_issue"] is False
        assert pull_request["merge_commit_sha"]
    kept = [(r["status"], r["summary"], r["pull_request"]["number"]) for r in results]
    assert kept[0] == kept[1]  # the same history, the same result, however it was polled


def test_the_merge_that_closed_the_issue_is_the_closer(forge: SandboxForge, tmp_path: Path) -> None:
    state = forge.state
    app = _app(forge, tmp_path)
    batch_id, repo, (number,) = _batch(app)
    owner, name = repo.split("/")
    pull = state.create_pull(
        owner, name, LANE, head="lane/1", base="main", title="Fix", body=f"Fixes #{number}"
    )
    _clock(forge).advance(2)
    state.merge_pull(owner, name, pull["number"], LANE)
    app.poller.poll_completed(batch_id)
    _settle(app, forge, batch_id)
    result = _result(app, batch_id)
    assert result["status"] == "passed"
    assert (result["pull_request"]["merged"], result["pull_request"]["closed_issue"]) == (
        True,
        True,
    )


def test_a_cancel_after_the_repo_was_renamed_ends_the_batch_cancelled(
    forge: SandboxForge, tmp_path: Path
) -> None:
    app = _app(forge, tmp_path)
    batch_id, repo, numbers = _batch(app, 2)
    owner, name = repo.split("/")
    forge.state.edit_repo(owner, name, new_name=f"{name}-renamed")
    forge.clear_requests()
    batch = app.lifecycle.cancel(batch_id)
    assert batch.status == BatchStatus.CANCELLED and batch.failure is None
    statuses = {t.status for t in app.store.get_tasks(batch_id)}
    assert statuses == {TaskStatus.CANCELLED}
    moved = f"{owner}/{name}-renamed"
    issues = forge.issues(owner, f"{name}-renamed")
    assert all(i["state"] == "closed" for i in issues if i["number"] in numbers)
    assert all("eval-cancelled" in [lb["name"] for lb in i["labels"]] for i in issues)
    assert app.gitea is not None and app.gitea.moved(repo) == moved
    assert app.store.get_batch(batch_id).repo == moved
    assert 307 in {r.status for r in forge.requests if r.method == "GET"}  # how it learned
    writes = [r for r in forge.requests if r.method != "GET"]
    assert writes and all(r.path.startswith(f"/api/v1/repos/{moved}/") for r in writes)


def test_a_write_to_a_renamed_repo_is_followed_or_asked_again_at_the_new_name(
    forge: SandboxForge, tmp_path: Path
) -> None:
    app = _app(forge, tmp_path)
    batch_id, repo, (number,) = _batch(app)
    owner, name = repo.split("/")
    forge.state.edit_repo(owner, name, new_name=f"{name}-moved")
    assert app.gitea is not None
    app.gitea.comment(repo, number, "followed with 307")  # method and body kept
    assert [r.status for r in forge.requests if r.method == "POST"][-2:] == [307, 201]
    forge.state.redirect_status = 302  # an old release: the framework default
    app.gitea.comment(repo, number, "asked at the new name")
    comments = forge.state.issue_comments(owner, f"{name}-moved", number)
    assert [c["body"] for c in comments] == ["followed with 307", "asked at the new name"]
    assert [r.status for r in forge.requests if r.method == "POST"][-2:] == [302, 201]
    app.poller.poll_completed(batch_id)  # the next visit stores the new name
    assert app.store.get_batch(batch_id).repo == f"{owner}/{name}-moved"
    assert f"{owner}/{name}-moved".casefold() in app.store.live_repos()


def test_the_search_path_follows_a_renamed_repo_and_ignores_a_copied_marker(
    forge: SandboxForge, tmp_path: Path
) -> None:
    state = forge.state
    app, worker, batches = _searching(forge, tmp_path)
    (moved_id, repo, (number,)), (still_id, still, (other_number,)) = batches
    owner, name = repo.split("/")
    state.edit_repo(owner, name, new_name=f"{name}-renamed")
    _clock(forge).advance(2)
    copied = state.get_issue(owner, still.split("/")[1], other_number)["body"]
    state.create_repo(owner, "elsewhere")
    state.create_issue(owner, "elsewhere", HUMAN, "copied by hand", body=copied)
    state.finish_issue(
        owner, f"{name}-renamed", number, comment="Lane verdict: PASS.", labels=["eval-pass"]
    )
    wait(worker.cycle())  # the search names the renamed repo's issue: list it by its name
    wait(worker.cycle())  # the visit stores the new name
    assert app.store.get_batch(moved_id).repo == f"{owner}/{name}-renamed"
    assert _result(app, moved_id)["status"] == "passed"
    assert app.store.get_batch(still_id).repo == still  # a copied marker moves nothing
    assert app.gitea is not None and app.gitea.moved(still) is None


class _Hops(BaseHTTPRequestHandler):
    """A loopback server that redirects with 307 and records the Authorization it gets."""

    routes: dict[tuple[int, str], str] = {}  # (port, path) -> Location
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.seen.append((self.path, self.headers.get("Authorization")))
        location = self.routes.get((self.server.server_address[1], self.path))
        body = b'{"version": "1.22.0", "login": "eval"}'
        self.send_response(307 if location else 200)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", "0" if location else str(len(body)))
        self.end_headers()
        if not location:
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


def test_a_307_is_followed_with_the_token_only_to_the_forge_s_origin() -> None:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Hops) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    forge_port, other_port = (s.server_address[1] for s in servers)
    _Hops.routes = {
        (forge_port, "/api/v1/version"): f"http://127.0.0.1:{other_port}/api/v1/version",
        (forge_port, "/api/v1/user"): "/api/v1/me",
    }
    try:
        client = GiteaClient(f"http://127.0.0.1:{forge_port}", "s3cret-token")
        assert client.version() == "1.22.0"  # answered by the other origin
        assert client.login() == "eval"
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert _Hops.seen == [
        ("/api/v1/version", "token s3cret-token"),
        ("/api/v1/version", None),  # another origin: no token
        ("/api/v1/user", "token s3cret-token"),
        ("/api/v1/me", "token s3cret-token"),  # the same origin keeps it
    ]


def test_the_summary_is_the_lane_s_not_a_later_human_comment(
    forge: SandboxForge, tmp_path: Path
) -> None:
    state = forge.state
    app = _app(forge, tmp_path)
    batch_id, repo, numbers = _batch(app, 3)
    owner, name = repo.split("/")
    for number in numbers[:2]:
        state.finish_issue(owner, name, number, comment="Lane verdict: PASS.", labels=["eval-pass"])
    state.finish_issue(owner, name, numbers[2], comment=None, labels=["eval-pass"])
    _clock(forge).advance(2)
    state.create_comment(owner, name, numbers[0], HUMAN, "thanks!")
    marked = "Re-run by hand: PASS.\n\n<!-- controller:fingerprint:00ff00ff00ff00ff -->"
    for number in numbers[1:]:
        state.create_comment(owner, name, number, HUMAN, marked)
    app.poller.poll_completed(batch_id)
    _settle(app, forge, batch_id)
    assert _result(app, batch_id, 0)["summary"] == "Lane verdict: PASS."
    # the lane's account wrote a comment: a pasted marker does not replace it
    assert _result(app, batch_id, 1)["summary"] == "Lane verdict: PASS."
    # a lane posting through another account: its marker makes the comment its own
    assert _result(app, batch_id, 2)["summary"] == "Re-run by hand: PASS."


def test_a_pull_request_in_another_repo_is_read_from_its_own_repo(
    forge: SandboxForge, tmp_path: Path
) -> None:
    state = forge.state
    app = _app(forge, tmp_path)
    batch_id, repo, (number,) = _batch(app)
    state.create_repo(forge.user, "code")
    state.create_issue(forge.user, "code", forge.user, "pads the numbers")
    pull = state.create_pull(
        forge.user,
        "code",
        LANE,
        head="lane/x",
        base="main",
        title="Fix",
        body=f"Closes {repo}#{number}",
    )
    _clock(forge).advance(2)
    state.merge_pull(forge.user, "code", pull["number"], LANE)
    app.poller.poll_completed(batch_id)
    _settle(app, forge, batch_id)
    result = _result(app, batch_id)
    merged = state.get_pull(forge.user, "code", pull["number"])
    assert result["status"] == "passed"
    reported = result["pull_request"]
    assert reported["repo"] == f"{forge.user}/code" and reported["number"] == pull["number"]
    assert reported["closed_issue"] is True
    assert reported["merge_commit_sha"] == merged["merge_commit_sha"]
    assert (reported["additions"], reported["changed_files"]) == (
        merged["additions"],
        merged["changed_files"],
    )
    gets = [r.path for r in forge.requests if r.path.endswith(f"/pulls/{pull['number']}")]
    assert gets == [f"/api/v1/repos/{forge.user}/code/pulls/{pull['number']}"]


def test_the_timeline_is_read_past_a_short_page(forge: SandboxForge, tmp_path: Path) -> None:
    state = forge.state
    app = _app(forge, tmp_path, settle_seconds=0)
    batch_id, repo, (number,) = _batch(app)
    owner, name = repo.split("/")
    state.create_repo(LANE, "private-scratch", private=True)
    state.create_pull(
        LANE, "private-scratch", LANE, head="x", base="main", title="t", body=f"see {repo}#{number}"
    )
    with state.lock:
        issue = state.repos[(owner.lower(), name.lower())].issues[number]
        for i in range(49):
            state.comment_on(issue, f"working {i}", HUMAN)
    state.finish_issue(owner, name, number, comment="Lane verdict: PASS.", labels=["eval-pass"])
    forge.clear_requests()
    app.poller.poll_completed(batch_id)
    result = _result(app, batch_id)
    assert result["summary"] == "Lane verdict: PASS."  # on page 2, after a page of 49
    pages = [r.query for r in forge.requests if r.path.endswith("/timeline")]
    assert pages == ["page=1&limit=50", "page=2&limit=50"]


def test_the_search_sends_no_label_filter_and_the_marker_decides(
    forge: SandboxForge, tmp_path: Path
) -> None:
    state = forge.state
    app, worker, batches = _searching(forge, tmp_path)
    (first, repo, (number,)), (second, other, _) = batches
    owner, name = repo.split("/")
    _clock(forge).advance(2)
    state.create_issue(owner, other.split("/")[1], HUMAN, "A question", labels=[])
    state.finish_issue(owner, name, number, comment="Lane verdict: PASS.", labels=["eval-pass"])
    forge.clear_requests()
    wait(worker.cycle())
    searches = [r for r in forge.requests if r.path.endswith("/repos/issues/search")]
    assert len(searches) == 1 and "labels" not in searches[0].query
    mine = f"/api/v1/repos/{owner}/"
    visited = {r.path.split("/")[5] for r in forge.requests if r.path.startswith(mine)}
    assert visited == {name}  # the human's issue (no marker) sent nobody to the other repo
    assert _result(app, first)["status"] == "passed"
    assert app.store.get_batch(second).status == BatchStatus.RUNNING


def test_a_comment_edited_while_settling_is_what_the_report_says(
    forge: SandboxForge, tmp_path: Path
) -> None:
    state, clock = forge.state, _clock(forge)
    results = []
    for polls in ((1, 11, 16), (30,)):  # early and often, or once long after
        app = _app(forge, tmp_path / f"polls-{len(polls)}")
        batch_id, repo, (number,) = _batch(app)
        owner, name = repo.split("/")
        start = clock.advance(2)
        comment = state.create_comment(owner, name, number, LANE, "Lane verdict: FAIL.")
        state.edit_issue(owner, name, number, state="closed", doer=LANE)
        for at, what in sorted([(5, "edit")] + [(at, "poll") for at in polls]):
            clock.set(start + at)
            if what == "edit":  # Gitea's UpdateComment: the issue does not move
                state.edit_comment(owner, name, comment["id"], LANE, "Lane verdict: PASS.")
            else:
                app.poller.poll_completed(batch_id)
        results.append(_result(app, batch_id))
    assert [r["summary"] for r in results] == ["Lane verdict: PASS."] * 2


def test_a_form_content_type_hook_is_accepted(forge: SandboxForge, tmp_path: Path) -> None:
    secret = "form-secret"
    app = _app(forge, tmp_path, forge_webhook_secret=secret)
    server = BackgroundServer(create_api(app.web), name="api")
    url = server.start()
    try:
        _, repo, (number,) = _batch(app)
        config = {"url": f"{url}/hooks/forge", "content_type": "form", "secret": secret}
        forge.state.hooks.add(f"owner:{forge.user}", config["url"], secret, ["issues"], "form")
        owner, name = repo.split("/")
        forge.state.edit_issue(owner, name, number, state="closed", doer=LANE)
        assert forge.state.hooks.drain(10)
        assert app.webhooks.counts["accepted"] >= 1 and not app.webhooks.counts["bad_signature"]
        assert app.nudges.take() == {repo.casefold()}
        payload = json.dumps({"repository": {"full_name": repo}})
        forged = hmac.new(secret.encode(), urlencode({"payload": payload}).encode(), hashlib.sha256)
        answer = requests.post(
            f"{url}/hooks/forge",
            data=urlencode({"payload": payload}),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Gitea-Event": "issues",
                "X-Gitea-Delivery": str(uuid.uuid4()),
                "X-Gitea-Signature": forged.hexdigest(),  # over the form body: not Gitea's
            },
            timeout=10,
        )
        assert answer.status_code == 401 and answer.json()["outcome"] == "bad_signature"
    finally:
        server.stop()
