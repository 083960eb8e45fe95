"""The sandbox says no where Gitea says no: each behaviour below was read
in Gitea's sources (the function is named in the sandbox's code) and is checked over real
loopback HTTP."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qs

import pytest
from conftest import Receiver, wait_for
from sandbox_client import Api, new_api, schema_errors

from dropbox_eval.sandbox import ManualClock, SandboxForge


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxForge]:
    """One Gitea-flavoured forge on a manual clock, shared by the module."""
    with SandboxForge(port=0, clock=ManualClock()) as running:
        yield running


@pytest.fixture
def api(sandbox: SandboxForge) -> Api:
    return new_api(sandbox)


def _tick(api: Api, seconds: float = 5) -> None:
    clock = api.forge.state.clock
    assert isinstance(clock, ManualClock)
    clock.advance(seconds)


def _issue_json(api: Api, number: int) -> dict[str, Any]:
    answer = api.get(f"/issues/{number}")
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data


def test_a_merge_leaves_an_issue_closed_by_hand_alone(api: Api) -> None:
    number = api.issue()
    pull = api.pull(f"Closes #{number}")
    _tick(api)
    assert api.patch(f"/issues/{number}", {"state": "closed"}).status_code == 201
    closed = _issue_json(api, number)
    _tick(api)
    merged = api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"})
    assert merged.status_code == 200
    # services/pull/merge.go: only `close != IsClosed` changes the issue; nothing else does
    assert _issue_json(api, number)["updated_at"] == closed["updated_at"]
    closes = [e for e in api.timeline(number) if e["type"] == "close"]
    assert len(closes) == 1 and closes[0]["user"]["login"] == api.owner
    assert closes[0]["ref_commit_sha"] == ""
    ref = api.timeline(number)[0]["ref_issue"]
    assert ref["pull_request"]["merged"] is True


def test_a_merge_closes_an_open_issue_with_the_merge_commit(api: Api) -> None:
    number = api.issue()
    pull = api.pull(f"Fixes #{number}")
    _tick(api)
    assert api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"}).status_code == 200
    sha = api.get(f"/pulls/{pull['number']}").json()["merge_commit_sha"]
    close = api.timeline(number)[-1]
    assert close["type"] == "close" and close["ref_commit_sha"] == sha
    assert not schema_errors("TimelineComment", close)


@pytest.mark.parametrize(
    "body",
    [
        "```\nCloses #{n}\n```",
        "~~~\nCloses #{n}\n~~~",
        "<!-- Closes #{n} -->",
        "Use `Closes #{n}` to close it.",
        "    Closes #{n}",
        "[Closes #{n}](https://example.com)",
    ],
)
def test_references_in_markdown_code_or_comments_do_not_count(api: Api, body: str) -> None:
    number = api.issue()
    pull = api.pull(body.format(n=number))
    assert not [e for e in api.timeline(number) if e["type"] == "pull_ref"]
    assert api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"}).status_code == 200
    assert _issue_json(api, number)["state"] == "open"  # mdstripper: no reference at all


def test_a_reference_outside_the_markdown_code_still_closes(api: Api) -> None:
    number = api.issue()
    api.pull(f"```\nsee #{number}\n```\n\nCloses #{number}")
    refs = [e for e in api.timeline(number) if e["type"] == "pull_ref"]
    assert [e["ref_action"] for e in refs] == ["closes"]


def test_a_pull_request_in_another_repo_closes_the_issue_it_names(sandbox: SandboxForge) -> None:
    tasks, code = new_api(sandbox), new_api(sandbox)
    number = tasks.issue()
    pull = code.pull(f"Implements it.\n\nCloses {tasks.owner}/{tasks.repo}#{number}")
    ref = tasks.timeline(number)[-1]
    assert ref["type"] == "pull_ref" and ref["ref_action"] == "closes"
    assert ref["ref_issue"]["repository"]["full_name"] == f"{code.owner}/{code.repo}"
    assert ref["ref_issue"]["number"] == pull["number"]
    assert code.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"}).status_code == 200
    sha = code.get(f"/pulls/{pull['number']}").json()["merge_commit_sha"]
    close = tasks.timeline(number)[-1]
    assert close["type"] == "close" and close["ref_commit_sha"] == sha


def test_a_comment_edit_moves_the_comment_not_the_issue(api: Api) -> None:
    number = api.issue()
    comment = api.post(f"/issues/{number}/comments", {"body": "first"}).json()
    before = _issue_json(api, number)
    _tick(api, 7)
    edited = api.patch(f"/issues/comments/{comment['id']}", {"body": "second"})
    assert edited.status_code == 200 and edited.json()["body"] == "second"
    assert edited.json()["updated_at"] != comment["updated_at"]
    assert not schema_errors("Comment", edited.json())
    assert _issue_json(api, number)["updated_at"] == before["updated_at"]  # UpdateComment
    entry = api.timeline(number)[0]
    assert entry["body"] == "second" and entry["updated_at"] == edited.json()["updated_at"]
    assert entry["created_at"] == comment["created_at"]
    since = api.get("/issues", state="all", since=edited.json()["updated_at"]).json()
    assert number not in [i["number"] for i in since]  # a listing cannot see the edit
    assert api.patch(f"/issues/comments/{comment['id']}", {"body": ""}).status_code == 422
    assert api.patch("/issues/comments/999999", {"body": "x"}).status_code == 404
    other = new_api(api.forge)
    assert other.patch(f"/issues/comments/{comment['id']}", {"body": "x"}).status_code == 404


def test_label_edit_and_removal_from_an_issue(api: Api) -> None:
    label = api.label("eval-fail")
    number = api.issue(labels=[label])
    edited = api.patch(f"/labels/{label}", {"name": "eval-pass", "color": "#0F0"})
    assert edited.status_code == 200
    assert (edited.json()["name"], edited.json()["color"]) == ("eval-pass", "00ff00")
    assert [lb["name"] for lb in _issue_json(api, number)["labels"]] == ["eval-pass"]
    assert api.patch("/labels/999999", {"name": "x"}).status_code == 404
    assert api.patch(f"/labels/{label}", {"color": "nope"}).status_code == 422
    removed = api.session.delete(f"{api.repo_url}/issues/{number}/labels/{label}", timeout=5)
    assert removed.status_code == 204 and _issue_json(api, number)["labels"] == []
    event = api.timeline(number)[-1]
    assert event["type"] == "label" and event["body"] == "" and event["label"]["id"] == label
    gone = api.session.delete(f"{api.repo_url}/issues/{number}/labels/999999", timeout=5)
    assert gone.status_code == 422


def test_a_renamed_repo_redirects_every_method_with_307(api: Api) -> None:
    number = api.issue()
    renamed = api.patch("", {"name": f"{api.repo}-new"})
    assert renamed.status_code == 200 and renamed.json()["name"] == f"{api.repo}-new"
    old = f"{api.base}/repos/{api.owner}/{api.repo}"
    new = f"/api/v1/repos/{api.owner}/{api.repo}-new"
    answer = api.session.get(f"{old}/issues?state=all&page=1", allow_redirects=False, timeout=5)
    assert answer.status_code == 307
    assert answer.headers["Location"] == f"{new}/issues?state=all&page=1"
    posted = api.session.post(
        f"{old}/issues/{number}/comments", json={"body": "via the old name"}, timeout=5
    )
    assert posted.status_code == 201 and posted.history[0].status_code == 307
    assert api.session.get(f"{api.base}{new.removeprefix('/api/v1')}", timeout=5).ok
    api.forge.state.redirect_status = 302  # very old releases: the framework default
    try:
        moved = api.session.get(f"{old}", allow_redirects=False, timeout=5)
        assert moved.status_code == 302
    finally:
        api.forge.state.redirect_status = 307
    reused = api.session.post(f"{api.base}/user/repos", json={"name": api.repo}, timeout=5)
    assert reused.status_code == 201  # the old name is free again: it no longer redirects
    assert api.session.get(old, allow_redirects=False, timeout=5).status_code == 200


def test_an_archived_repo_answers_423_to_writes(api: Api) -> None:
    number = api.issue()
    assert api.patch("", {"archived": True}).json()["archived"] is True
    assert api.post("/issues", {"title": "x"}).status_code == 423
    refused = api.post(f"/issues/{number}/comments", {"body": "x"})
    assert refused.status_code == 423 and refused.json()["message"] == "repo is archived"
    assert api.get(f"/issues/{number}").status_code == 200  # reads still work
    assert api.patch("", {"archived": False}).json()["archived"] is False
    assert api.post(f"/issues/{number}/comments", {"body": "x"}).status_code == 201


def test_search_defaults_to_20_and_refuses_an_unknown_owner(api: Api) -> None:
    for i in range(25):
        api.issue(f"s{i}")
    search = f"{api.base}/repos/issues/search"
    page = api.session.get(search, params={"owner": api.owner, "type": "issues"}, timeout=5)
    assert len(page.json()) == 20 and 'rel="next"' in page.headers["Link"]
    unknown = api.session.get(search, params={"owner": "nobody-here"}, timeout=5)
    assert unknown.status_code == 400 and "user does not exist" in unknown.json()["message"]


def test_search_labels_are_resolved_across_the_whole_instance(sandbox: SandboxForge) -> None:
    mine, elsewhere = new_api(sandbox), new_api(sandbox)
    elsewhere.label("only-elsewhere")
    mine.issue("unlabelled")
    search = f"{mine.base}/repos/issues/search"
    params = {"owner": mine.owner, "type": "issues", "limit": 50}
    every = mine.session.get(search, params={**params, "labels": "no-such-label"}, timeout=5)
    assert "unlabelled" in [i["title"] for i in every.json()]  # no label of that name: no filter
    # a label of that name in any repo of the instance makes the filter real (Gitea's
    # GetLabelIDsByNames), even for an owner whose repos have none
    none = mine.session.get(search, params={**params, "labels": "only-elsewhere"}, timeout=5)
    assert none.status_code == 200 and none.json() == []
    assert len(sandbox.state.label_ids_named(["only-elsewhere"])) == 1


def test_the_timeline_drops_unreadable_references_after_paging(sandbox: SandboxForge) -> None:
    api = new_api(sandbox)
    number = api.issue()
    state = sandbox.state
    state.create_repo("lane-bot", "scratch-private", private=True)
    with state.lock:
        issue = state.repos[(api.owner, api.repo)].issues[number]
        for i in range(30):
            state.comment_on(issue, f"c{i}", api.owner)
    state.create_pull(
        "lane-bot",
        "scratch-private",
        "lane-bot",
        head="x",
        base="main",
        title="t",
        body=f"see {api.owner}/{api.repo}#{number}",
    )
    with state.lock:
        for i in range(30, 60):
            state.comment_on(issue, f"c{i}", api.owner)
    first = api.get(f"/issues/{number}/timeline", page=1, limit=50)
    # 50 rows read, the cross-reference from a private repo of another user dropped after
    assert len(first.json()) == 49 and "Link" not in first.headers
    assert first.headers["X-Total-Count"] == "49"
    second = api.timeline(number, page=2, limit=50)
    assert [e["body"] for e in second] == [f"c{i}" for i in range(49, 60)]
    assert "pull_ref" not in [e["type"] for e in api.timeline(number)]


def test_open_counts_are_kept_not_counted(api: Api) -> None:
    numbers = [api.issue() for _ in range(3)]
    pull = api.pull("no refs")

    def counts() -> tuple[int, int]:
        repo = api.get("").json()
        return repo["open_issues_count"], repo["open_pr_counter"]

    assert counts() == (3, 1)
    api.patch(f"/issues/{numbers[0]}", {"state": "closed"})
    assert counts() == (2, 1)
    api.patch(f"/issues/{numbers[0]}", {"state": "open"})
    api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"})
    assert counts() == (3, 0)
    api.session.delete(f"{api.repo_url}/issues/{numbers[1]}", timeout=5)
    assert counts() == (2, 0)


def test_a_form_hook_posts_payload_signed_over_the_json(
    sandbox: SandboxForge, receiver: Receiver
) -> None:
    api = new_api(sandbox)
    config = {"url": receiver.url, "content_type": "form", "secret": "s3cret"}
    hook = api.post(
        "/hooks", {"type": "gitea", "active": True, "config": config, "events": ["issues"]}
    )
    assert hook.status_code == 201 and hook.json()["config"]["content_type"] == "form"
    bad = dict(config, content_type="xml")
    refused = api.post("/hooks", {"type": "gitea", "active": True, "config": bad})
    assert refused.status_code == 422
    api.issue("hooked")
    assert wait_for(lambda: len(receiver.received) >= 1, 10)
    headers, body = receiver.received[0]
    assert headers["content-type"] == "application/x-www-form-urlencoded"
    payload = parse_qs(body.decode())["payload"][0]
    assert json.loads(payload)["issue"]["title"] == "hooked"
    expected = hmac.new(b"s3cret", payload.encode(), hashlib.sha256).hexdigest()
    assert headers["x-gitea-signature"] == expected


def test_the_forge_clock_stamps_changes_and_the_date_header(api: Api) -> None:
    clock = api.forge.state.clock
    assert isinstance(clock, ManualClock)
    moment = clock.advance(3600)
    number = api.issue()
    answer = api.get(f"/issues/{number}")
    stamp = datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert answer.json()["created_at"] == stamp == answer.json()["updated_at"]
    assert parsedate_to_datetime(answer.headers["Date"]).timestamp() == moment
