"""`GET /repos/{o}/{r}/issues/{n}/timeline` answers like Gitea's (real loopback HTTP)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sandbox_client import Api, new_api, schema_errors

from dropbox_eval.sandbox import SandboxForge


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxForge]:
    with SandboxForge(port=0) as running:
        yield running


@pytest.fixture
def api(sandbox: SandboxForge) -> Api:
    return new_api(sandbox)


def test_every_entry_type_is_a_valid_timeline_comment(api: Api) -> None:
    task = api.label("eval-task")
    number = api.issue("target", labels=[task])
    api.post(f"/issues/{number}/comments", {"body": "working on it"})
    pull = api.pull(f"Closes #{number}")
    api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"})
    api.patch(f"/issues/{number}", {"state": "open"})
    entries = api.timeline(number)
    assert [e["type"] for e in entries] == ["label", "comment", "pull_ref", "close", "reopen"]
    for entry in entries:
        assert schema_errors("TimelineComment", entry) == [], entry["type"]
        assert entry["created_at"].endswith("Z") and entry["updated_at"].endswith("Z")
        assert entry["user"]["login"] == api.owner
        assert entry["issue_url"].endswith(f"/{api.repo}/issues/{number}")
    label, comment, ref, close, _ = entries
    assert label["label"]["name"] == "eval-task" and label["body"] == "1"
    assert comment["body"] == "working on it" and comment["label"] is None
    assert ref["ref_action"] == "closes" and ref["ref_issue"]["number"] == pull["number"]
    assert ref["ref_issue"]["pull_request"]["merged"] is True
    assert close["ref_issue"] is None and close["body"] == ""
    assert len({e["id"] for e in entries}) == 5  # one id sequence with comments
    comment_ids = [c["id"] for c in api.get(f"/issues/{number}/comments").json()]
    assert comment_ids == [comment["id"]]


def test_pull_request_timeline_uses_pull_urls(api: Api) -> None:
    pull = api.pull("no refs")
    api.post(f"/issues/{pull['number']}/comments", {"body": "lgtm"})
    api.patch(f"/pulls/{pull['number']}", {"state": "closed"})
    entries = api.timeline(pull["number"])
    assert [e["type"] for e in entries] == ["comment", "close"]
    assert entries[0]["issue_url"] == "" and entries[0]["pull_request_url"] == pull["html_url"]


def test_paging_limit_capped_at_50_and_gitea_headers(api: Api) -> None:
    number = api.issue()
    with api.forge.state.lock:  # 120 comments without 120 round trips
        issue = api.forge.state.repos[(api.owner, api.repo)].issues[number]
        for i in range(120):
            api.forge.state.comment_on(issue, f"c{i}", api.owner)
    everything = api.get(f"/issues/{number}/timeline")
    assert len(everything.json()) == 120  # no `page`: no paging at all, like Gitea
    first = api.get(f"/issues/{number}/timeline", page=1, limit=100)
    assert [e["body"] for e in first.json()] == [f"c{i}" for i in range(50)]
    # Gitea's ListIssueCommentsAndTimeline counts the page, not the total, and sends no Link.
    assert first.headers["X-Total-Count"] == "50" and "Link" not in first.headers
    assert "X-Total-Count" in first.headers["Access-Control-Expose-Headers"]
    third = api.get(f"/issues/{number}/timeline", page=3, limit=50)
    assert [e["body"] for e in third.json()] == [f"c{i}" for i in range(100, 120)]
    assert third.headers["X-Total-Count"] == "20"
    default = api.get(f"/issues/{number}/timeline", page=2)
    assert len(default.json()) == 30 and default.json()[0]["body"] == "c30"
    assert api.get(f"/issues/{number}/timeline", page=9).json() == []


def test_since_before_filter_and_bad_time(api: Api) -> None:
    number = api.issue()
    api.post(f"/issues/{number}/comments", {"body": "old"})
    with api.forge.state.lock:
        issue = api.forge.state.repos[(api.owner, api.repo)].issues[number]
        issue.comments[0].created -= 100
        issue.comments[0].updated -= 100
    api.post(f"/issues/{number}/comments", {"body": "new"})
    cutoff = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 50))
    assert [e["body"] for e in api.timeline(number, since=cutoff)] == ["new"]
    assert [e["body"] for e in api.timeline(number, before=cutoff)] == ["old"]
    assert api.get(f"/issues/{number}/timeline", since="yesterday").status_code == 422


def test_pull_ref_bumps_the_referenced_issue(api: Api) -> None:
    number = api.issue()
    with api.forge.state.lock:
        api.forge.state.repos[(api.owner, api.repo)].issues[number].updated -= 100
    before = api.get(f"/issues/{number}").json()["updated_at"]
    api.pull(f"closes #{number}")
    assert api.get(f"/issues/{number}").json()["updated_at"] > before  # `since` polls see it


def test_missing_issue_answers_500_on_gitea(api: Api) -> None:
    for path in ("/issues/999/timeline", "/issues/abc/timeline"):
        response = api.get(path)
        assert response.status_code == 500 and response.json()["message"] == "GetRawIssueByIndex"


def test_missing_issue_answers_404_on_forgejo() -> None:
    with SandboxForge(port=0, flavor="forgejo") as forgejo:
        api = new_api(forgejo)
        for path in ("/issues/999/timeline", "/issues/999/comments", "/issues/x/timeline"):
            response = api.get(path)
            assert response.status_code == 404 and response.json()["message"] == "not found"
        assert api.post("/issues/999/comments", {"body": "x"}).status_code == 404
