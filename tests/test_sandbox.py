"""The sandbox forge behaves like Gitea for the subset the product uses (real loopback HTTP)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime

import pytest
import requests
from conftest import PATIENCE, wait_for
from sandbox_client import Api, new_api, session

from dropbox_eval.sandbox import ForgeState, RequestLogEntry, SandboxForge, SimulatedLane


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxForge]:
    """One forge (no lane) shared by the module; tests use fresh repos."""
    with SandboxForge(port=0) as running:
        yield running


@pytest.fixture
def api(sandbox: SandboxForge) -> Iterator[Api]:
    """A fresh repo in the user's namespace, with faults and the log reset."""
    made = new_api(sandbox)
    yield made
    sandbox.state.faults.clear()
    made.session.close()


def _age(forge: SandboxForge, api: Api, number: int, seconds: float) -> None:
    """Move an issue's created/updated times into the past (test-only state access)."""
    with forge.state.lock:
        issue = forge.state.repos[(api.owner, api.repo)].issues[number]
        issue.created -= seconds
        issue.updated -= seconds


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# ----- auth, version, settings -------------------------------------------------------------
def test_auth_401_without_or_with_wrong_token(sandbox: SandboxForge) -> None:
    base = f"{sandbox.url}/api/v1"
    assert requests.get(f"{base}/version", timeout=30).json() == {"version": "1.22.0+sandbox"}
    missing = requests.get(f"{base}/user", timeout=30)
    assert missing.status_code == 401
    assert missing.json() == {"message": "token is required", "url": f"{sandbox.url}/api/swagger"}
    wrong = requests.get(f"{base}/user", headers={"Authorization": "token nope"}, timeout=30)
    assert wrong.status_code == 401
    assert wrong.json()["message"].startswith("user does not exist")
    for scheme in ("token", "TOKEN", "Bearer", "bearer"):
        ok = requests.get(
            f"{base}/user", headers={"Authorization": f"{scheme} {sandbox.token}"}, timeout=30
        )
        assert ok.status_code == 200 and ok.json()["login"] == sandbox.user
    settings = session(sandbox.token).get(f"{base}/settings/api", timeout=30).json()
    assert settings["max_response_items"] == 50 and settings["default_paging_num"] == 30


def test_port_zero_binds_a_real_port(sandbox: SandboxForge) -> None:
    port = int(sandbox.url.rsplit(":", 1)[1])
    assert port > 0 and sandbox.url == f"http://127.0.0.1:{port}"


# ----- repositories --------------------------------------------------------------------------
def test_repo_create_201_409_422_and_org(api: Api) -> None:
    base = api.base
    dup = api.session.post(f"{base}/user/repos", json={"name": api.repo}, timeout=30)
    assert dup.status_code == 409
    assert dup.json()["message"] == "The repository with the same name already exists."
    bad = api.session.post(f"{base}/user/repos", json={"name": "bad name!"}, timeout=30)
    assert bad.status_code == 422
    missing = api.session.post(f"{base}/user/repos", json={}, timeout=30)
    assert missing.status_code == 422 and missing.json()["message"] == "[Name]: Required"
    org = api.session.post(f"{base}/orgs/evalorg/repos", json={"name": api.repo}, timeout=30)
    assert org.status_code == 201 and org.json()["full_name"] == f"evalorg/{api.repo}"
    assert org.json()["owner"]["login"] == "evalorg" and org.json()["has_issues"] is True
    nobody = api.session.post(f"{base}/orgs/noorg/repos", json={"name": "z"}, timeout=30)
    assert nobody.status_code == 404
    assert nobody.json() == {
        "errors": None,
        "message": "not found",
        "url": f"{api.forge.url}/api/swagger",
    }
    assert api.get("").json()["name"] == api.repo
    assert api.session.get(f"{base}/repos/eval/nope", timeout=30).status_code == 404
    assert api.session.get(f"{base}/repos/eval/nope/issues", timeout=30).status_code == 404


# ----- labels -------------------------------------------------------------------------------
def test_label_duplicates_allowed_and_colors_normalized(api: Api) -> None:
    colors = {"#ABC": "aabbcc", "abc": "aabbcc", "#12AB34": "12ab34", "FF0000": "ff0000"}
    for given, expected in colors.items():
        response = api.post("/labels", {"name": "bug", "color": given})
        assert response.status_code == 201
        assert response.json()["color"] == expected
    bad = api.post("/labels", {"name": "bug", "color": "#12345"})
    assert bad.status_code == 422 and bad.json()["message"].startswith("invalid color")
    listed = api.get("/labels")
    assert [label["name"] for label in listed.json()] == ["bug"] * 4
    assert len({label["id"] for label in listed.json()}) == 4
    assert listed.headers["X-Total-Count"] == "4"
    paged = api.get("/labels", page=2, limit=3)
    assert len(paged.json()) == 1 and paged.headers["X-Total-Count"] == "4"


# ----- create issue ---------------------------------------------------------------------------
def test_issue_create_with_label_ids_names_and_titles(api: Api) -> None:
    bug = api.label("bug")
    created = api.post("/issues", {"title": "One", "body": "b", "labels": [bug, 9999]})
    assert created.status_code == 201
    issue = created.json()
    assert [label["id"] for label in issue["labels"]] == [bug]  # unknown id dropped silently
    assert issue["number"] == 1 and issue["state"] == "open" and issue["pull_request"] is None
    assert issue["html_url"] == f"{api.forge.url}/{api.owner}/{api.repo}/issues/1"
    assert issue["url"] == f"{api.repo_url}/issues/1"
    assert issue["created_at"].endswith("Z") and len(issue["created_at"]) == 20
    by_name = api.post("/issues", {"title": "Two", "labels": ["bug"]})
    assert by_name.status_code == 422 and "unmarshal string" in by_name.json()["message"]
    for body in ({"title": ""}, {"body": "no title"}):
        empty = api.post("/issues", body)
        assert empty.status_code == 422 and empty.json()["message"] == "[Title]: Required"
    assert api.issue("next") == 2  # failed creates used no number


def test_long_titles_truncated_to_255(api: Api) -> None:
    response = api.post("/issues", {"title": "x" * 300})  # Gitea: EllipsisDisplayString
    assert response.status_code == 201 and response.json()["title"] == "x" * 252 + "…"


# ----- list issues ----------------------------------------------------------------------------
def test_list_paging_capped_at_50_with_link_and_total(api: Api) -> None:
    for i in range(120):
        api.issue(f"t{i}")
    first = api.get("/issues", limit=100)
    assert len(first.json()) == 50
    assert [i["number"] for i in first.json()[:2]] == [120, 119]  # newest first
    assert first.headers["X-Total-Count"] == "120"
    link = first.headers["Link"]
    assert 'page=2>; rel="next"' in link and 'page=3>; rel="last"' in link
    assert 'rel="prev"' not in link and link.startswith(f"<{api.repo_url}/issues?")
    assert "Link" in first.headers["Access-Control-Expose-Headers"]
    last = api.get("/issues", limit=50, page=3)
    assert [i["number"] for i in last.json()] == list(range(20, 0, -1))
    assert 'rel="next"' not in last.headers["Link"] and 'rel="first"' in last.headers["Link"]
    assert 'page=2>; rel="prev"' in last.headers["Link"]
    assert api.get("/issues", page=9).json() == []
    assert len(api.get("/issues").json()) == 30  # default page size


def test_labels_filter_is_and_and_unknown_names_are_ignored(api: Api) -> None:
    a, b = api.label("a"), api.label("b")
    only_a, both, neither = api.issue(labels=[a]), api.issue(labels=[a, b]), api.issue()

    def numbers(labels: str) -> list[int]:
        return [i["number"] for i in api.get("/issues", labels=labels).json()]

    assert numbers("a") == [both, only_a]
    assert numbers("a,b") == [both]
    assert numbers("nope") == [neither, both, only_a]  # Gitea quirk: filter dropped
    assert numbers("b,nope") == [both]


def test_state_filter_and_patch_returns_201(api: Api) -> None:
    first, second = api.issue("one"), api.issue("two")
    patched = api.session.patch(
        f"{api.repo_url}/issues/{first}", json={"state": "closed", "title": "renamed"}, timeout=30
    )
    assert patched.status_code == 201
    assert patched.json()["state"] == "closed" and patched.json()["closed_at"] is not None
    assert patched.json()["title"] == "renamed"
    assert [i["number"] for i in api.get("/issues").json()] == [second]
    assert [i["number"] for i in api.get("/issues", state="closed").json()] == [first]
    assert len(api.get("/issues", state="all").json()) == 2
    assert api.get("/issues", type="pulls").json() == []
    bad = api.session.patch(f"{api.repo_url}/issues/{first}", json={"state": "x"}, timeout=30)
    assert bad.status_code == 412
    reopened = api.session.patch(
        f"{api.repo_url}/issues/{first}", json={"state": "open"}, timeout=30
    )
    assert reopened.json()["state"] == "open" and reopened.json()["closed_at"] is None


def test_since_and_before_filter_updated_at(api: Api) -> None:
    old, new = api.issue("old"), api.issue("new")
    _age(api.forge, api, old, 3600)
    cutoff = _iso(time.time() - 60)
    assert [i["number"] for i in api.get("/issues", since=cutoff).json()] == [new]
    assert [i["number"] for i in api.get("/issues", before=cutoff).json()] == [old]
    offset = cutoff.replace("Z", "+00:00")  # requests encodes '+' correctly
    assert [i["number"] for i in api.get("/issues", since=offset).json()] == [new]
    assert api.post(f"/issues/{old}/comments", {"body": "bump"}).status_code == 201
    assert {i["number"] for i in api.get("/issues", since=cutoff).json()} == {old, new}
    for bad in ("2026-01-01T00:00:00", "yesterday", "2026-13-01T00:00:00Z"):
        response = api.get("/issues", since=bad)
        assert response.status_code == 422, bad
        assert "parsing time" in response.json()["message"]


# ----- single issue, comments, issue labels -------------------------------------------------
def test_get_delete_issue_and_numbers_not_reused(api: Api) -> None:
    number = api.issue()
    assert api.get(f"/issues/{number}").json()["number"] == number
    deleted = api.session.delete(f"{api.repo_url}/issues/{number}", timeout=30)
    assert deleted.status_code == 204
    assert api.get(f"/issues/{number}").status_code == 404
    assert api.get("/issues/abc").status_code == 404
    assert api.issue() == number + 1


def test_comments_and_missing_issue_500(api: Api) -> None:
    number = api.issue()
    created = api.post(f"/issues/{number}/comments", {"body": "hello"})
    assert created.status_code == 201
    comment = created.json()
    assert comment["body"] == "hello" and comment["user"]["login"] == api.owner
    assert comment["issue_url"] == f"{api.forge.url}/{api.owner}/{api.repo}/issues/{number}"
    api.post(f"/issues/{number}/comments", {"body": "second"})
    listed = api.get(f"/issues/{number}/comments")
    assert [c["body"] for c in listed.json()] == ["hello", "second"]
    assert listed.headers["X-Total-Count"] == "2"
    assert api.get(f"/issues/{number}").json()["comments"] == 2
    for response in (
        api.get("/issues/999/comments"),
        api.post("/issues/999/comments", {"body": "x"}),
    ):
        assert response.status_code == 500
        assert response.json()["message"] == "GetRawIssueByIndex"
    assert api.post(f"/issues/{number}/comments", {}).status_code == 422
    repo_wide = api.get("/issues/comments")
    assert repo_wide.headers["X-Total-Count"] == "2" and len(repo_wide.json()) == 2
    assert len(api.get("/issues/comments", page=2, limit=1).json()) == 1


def test_issue_labels_endpoint_ids_names_and_mixing(api: Api) -> None:
    a, b = api.label("a"), api.label("b")
    number = api.issue()
    by_id = api.post(f"/issues/{number}/labels", {"labels": [a]})
    assert by_id.status_code == 200 and [lb["name"] for lb in by_id.json()] == ["a"]
    by_name = api.post(f"/issues/{number}/labels", {"labels": ["b", "unknown"]})
    assert by_name.status_code == 200 and [lb["id"] for lb in by_name.json()] == [a, b]
    mixed = api.post(f"/issues/{number}/labels", {"labels": [a, "b"]})
    assert mixed.status_code == 400
    assert mixed.json()["message"] == "labels should be an array of strings or integers"
    assert [lb["name"] for lb in api.get(f"/issues/{number}/labels").json()] == ["a", "b"]


def test_helpers_finish_delete_and_issues(api: Api) -> None:
    first, second = api.issue("one"), api.issue("two")
    api.forge.finish_issue(api.owner, api.repo, first, comment="done", labels=["eval-pass"])
    issues = api.forge.issues(api.owner, api.repo)
    assert [i["number"] for i in issues] == [first, second]  # creation order
    assert issues[0]["state"] == "closed" and issues[0]["comments"] == 1
    assert issues[0]["labels"][0]["name"] == "eval-pass"
    assert issues[0]["labels"][0]["color"] == "00aa00"
    api.forge.delete_issue(api.owner, api.repo, second)
    assert [i["number"] for i in api.forge.issues(api.owner, api.repo)] == [first]


# ----- lane ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lane_forge() -> Iterator[SandboxForge]:
    """A forge whose lane thread never fires on its own (tests call run_once)."""
    with SandboxForge(port=0, lane_delay=0, lane_interval=3600) as running:
        yield running


def test_lane_closes_due_task_issues_with_verdict(lane_forge: SandboxForge) -> None:
    lane_session = session(lane_forge.token)
    api = Api(lane_forge, lane_session, lane_forge.user, "lanerepo")
    lane_session.post(f"{api.base}/user/repos", json={"name": api.repo}, timeout=30)
    task = api.label("eval-task")
    good = api.issue("Good", labels=[task])
    bad = api.issue("Bad", body="please lane:fail now", labels=[task])
    other = api.issue("Not a task")
    assert lane_forge.lane is not None
    assert lane_forge.lane.run_once() == 2
    assert lane_forge.lane.run_once() == 0
    verdicts = {good: ("PASS", "pass", "eval-pass"), bad: ("FAIL", "fail", "eval-fail")}
    for number, (word, verdict, label) in verdicts.items():
        issue = api.get(f"/issues/{number}").json()
        assert issue["state"] == "closed"
        assert label in [lb["name"] for lb in issue["labels"]]
        comments = api.get(f"/issues/{number}/comments").json()
        assert comments[-1]["user"]["login"] == "lane-bot"
        assert comments[-1]["body"].startswith(f'Lane verdict: {word} for "{issue["title"]}".')
        assert f'"verdict": "{verdict}"' in comments[-1]["body"]
    assert api.get(f"/issues/{other}").json()["state"] == "open"


def test_lane_waits_for_delay_and_thread_runs() -> None:
    state = ForgeState()
    state.create_repo("eval", "r")
    label = state.create_label("eval", "r", "eval-task", "00ff00")["id"]
    state.create_issue("eval", "r", "eval", "t", labels=[label])
    assert SimulatedLane(state, delay=60).run_once() == 0
    lane = SimulatedLane(state, delay=0, interval=0.02)
    lane.start()
    try:
        closed = wait_for(lambda: state.get_issue("eval", "r", 1)["state"] == "closed")
        assert closed, "lane thread never closed the issue"
    finally:
        lane.stop()


# ----- faults and request log -----------------------------------------------------------------
def test_fail_next_with_retry_after_has_no_side_effects(api: Api) -> None:
    api.forge.fail_next(2, 429, retry_after=7, path_contains="/issues")
    assert api.session.get(f"{api.base}/user", timeout=30).status_code == 200  # not matching
    for _ in range(2):
        failed = api.post("/issues", {"title": "x"})
        assert failed.status_code == 429 and failed.headers["Retry-After"] == "7"
        assert failed.json() == {"message": "sandbox fault"}
    assert api.forge.issues(api.owner, api.repo) == []
    assert api.issue() == 1
    control = requests.post(
        f"{api.forge.url}/_sandbox/faults", json={"count": 1, "status": 502}, timeout=30
    )
    assert control.status_code == 200
    assert api.get("").status_code == 502 and api.get("").status_code == 200


def test_fail_for_and_delay(api: Api) -> None:
    api.forge.fail_for(PATIENCE)  # an outage longer than any request could take to arrive
    assert [api.get("").status_code for _ in range(2)] == [503, 503]
    api.forge.state.faults.clear()
    assert api.get("").status_code == 200
    api.forge.fail_for(0.3)  # a short one ends by itself
    assert wait_for(lambda: api.get("").status_code == 200)
    api.forge.set_delay(0.2)
    started = time.monotonic()
    assert api.get("").status_code == 200
    assert time.monotonic() - started >= 0.2
    api.forge.set_delay(0)


def test_request_log_records_every_api_request(api: Api) -> None:
    api.forge.clear_requests()
    requests.get(f"{api.base}/user", timeout=30)
    api.post("/issues", {"title": "logged"})
    api.get("/issues", state="all")
    expected = [
        RequestLogEntry("GET", "/api/v1/user", 401, ""),
        RequestLogEntry("POST", f"/api/v1/repos/{api.owner}/{api.repo}/issues", 201, ""),
        RequestLogEntry("GET", f"/api/v1/repos/{api.owner}/{api.repo}/issues", 200, "state=all"),
    ]
    assert api.forge.requests == expected
    over_http = requests.get(f"{api.forge.url}/_sandbox/requests", timeout=30).json()
    assert over_http[1] == {"method": "POST", "path": expected[1].path, "status": 201, "query": ""}
    assert len(api.forge.requests) == 3  # control routes are not logged


def test_control_validation_errors_are_gitea_shaped(sandbox: SandboxForge) -> None:
    response = requests.post(f"{sandbox.url}/_sandbox/delay", json={"seconds": "soon"}, timeout=30)
    assert response.status_code == 422
    assert set(response.json()) == {"message", "url"}


def test_the_date_header_is_the_clock_at_answer_time_and_sent_once(forge: SandboxForge) -> None:
    # uvicorn's own Date is refreshed once per loop tick and lags under load; Gitea's is
    # taken per answer, and `since` and settling are measured against it
    before = time.time()
    answer = requests.get(f"{forge.url}/api/v1/version", timeout=30)
    after = time.time()
    raw = answer.raw.headers.getlist("Date")
    assert len(raw) == 1
    stamp = parsedate_to_datetime(raw[0]).timestamp()
    assert int(before) <= stamp <= after
