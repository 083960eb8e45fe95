"""Pull requests on the sandbox forge behave like Gitea's (real loopback HTTP)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from sandbox_client import Api, new_api, schema_errors

from dropbox_eval.sandbox import SandboxForge


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxForge]:
    """One Gitea-flavoured forge (no lane) shared by the module; tests use fresh repos."""
    with SandboxForge(port=0) as running:
        yield running


@pytest.fixture
def api(sandbox: SandboxForge) -> Api:
    return new_api(sandbox)


def _refs(api: Api, number: int) -> list[tuple[int, str]]:
    return [
        (entry["ref_issue"]["number"], entry["ref_action"])
        for entry in api.timeline(number)
        if entry["type"] == "pull_ref"
    ]


@pytest.mark.parametrize(
    "word",
    [
        "close",
        "closes",
        "closed",
        "fix",
        "fixes",
        "fixed",
        "resolve",
        "resolves",
        "resolved",
        "CLOSES",
        "Fixes:",
        "ReSoLvEd",
    ],
)
def test_each_closing_keyword_adds_a_closing_pull_ref(api: Api, word: str) -> None:
    number = api.issue("target")
    pull = api.pull(f"Some work.\n\n{word} #{number}")
    assert _refs(api, number) == [(pull["number"], "closes")]
    ref_issue = api.timeline(number)[-1]["ref_issue"]
    assert ref_issue["pull_request"]["merged"] is False
    assert ref_issue["pull_request"]["html_url"] == pull["html_url"]
    assert ref_issue["html_url"].endswith(f"/pulls/{pull['number']}")


def test_reference_forms_that_do_not_close(api: Api) -> None:
    plain, reopen, missing = api.issue("plain"), api.issue("reopen"), 999
    spaced, glued = api.issue("spaced"), api.issue("glued")
    body = (
        f"See #{plain}. Reopens #{reopen}, closes #{missing}\ncloses  #{spaced} and fixes#{glued}"
    )
    api.pull(body)
    assert [action for _, action in _refs(api, plain)] == ["none"]
    assert [action for _, action in _refs(api, reopen)] == ["reopens"]
    assert [action for _, action in _refs(api, spaced)] == ["none"]  # two spaces: no keyword
    assert _refs(api, glued) == []  # `fixes#N` is not a reference at all


def test_pull_shares_numbers_with_issues_and_type_filters(api: Api) -> None:
    first = api.issue("one")
    pull = api.pull(f"closes #{first}")
    assert pull["number"] == first + 1 and api.issue("two") == first + 2
    as_issue = api.get(f"/issues/{pull['number']}").json()
    assert as_issue["pull_request"] == {
        "merged": False,
        "merged_at": None,
        "draft": False,
        "html_url": pull["html_url"],
    }
    only_issues = api.get("/issues", type="issues")
    assert [i["number"] for i in only_issues.json()] == [first + 2, first]
    assert only_issues.headers["X-Total-Count"] == "2"
    only_pulls = api.get("/issues", type="pulls")
    assert [i["number"] for i in only_pulls.json()] == [pull["number"]]
    assert api.get("/issues").headers["X-Total-Count"] == "3"  # default: both
    assert api.get("").json()["open_issues_count"] == 2
    assert api.get("").json()["open_pr_counter"] == 1
    assert api.get(f"/pulls/{first}").status_code == 404  # a plain issue is not a PR


def test_create_validation(api: Api) -> None:
    cases = {
        (("head", "a"), ("base", "main")): "[Title]: Required",
        (("base", "main"), ("title", "t")): "[Head]: Required",
        (("head", "main"), ("base", "main"), ("title", "t")): "",
    }
    for fields, message in cases.items():
        response = api.post("/pulls", dict(fields))
        assert response.status_code == 422
        assert message in response.json()["message"]
    api.pull("x", head="same")
    again = api.post("/pulls", {"head": "same", "base": "main", "title": "t"})
    assert again.status_code == 409


def test_merge_closes_the_issue_and_sets_the_merge_sha(api: Api) -> None:
    number = api.issue("target")
    pull = api.pull(f"Closes #{number}")
    assert pull["merged"] is False and pull["merge_commit_sha"] is None
    assert schema_errors("PullRequest", pull) == []
    assert api.get(f"/pulls/{pull['number']}/merge").status_code == 404
    merged = api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"})
    assert merged.status_code == 200 and merged.content == b""
    after = api.get(f"/pulls/{pull['number']}").json()
    assert after["merged"] is True and after["state"] == "closed"
    assert re.fullmatch(r"[0-9a-f]{40}", after["merge_commit_sha"])
    assert after["merged_by"]["login"] == api.owner and after["merged_at"]
    assert schema_errors("PullRequest", after) == []
    assert api.get(f"/pulls/{pull['number']}/merge").status_code == 204
    issue = api.get(f"/issues/{number}").json()
    assert issue["state"] == "closed"
    close = api.timeline(number)[-1]
    assert close["type"] == "close" and close["user"]["login"] == api.owner
    assert api.timeline(number)[-2]["ref_issue"]["pull_request"]["merged"] is True
    assert api.timeline(pull["number"])[-1]["type"] == "merge_pull"
    again = api.post(f"/pulls/{pull['number']}/merge", {"do": "merge"})
    assert again.status_code == 405 and again.json()["message"] == ""
    state_change = api.patch(f"/pulls/{pull['number']}", {"state": "open"})
    assert state_change.status_code == 412


def test_merge_validation_and_missing(api: Api) -> None:
    pull = api.pull("nothing referenced")
    assert api.post(f"/pulls/{pull['number']}/merge", {}).json()["message"] == "[Do]: Required"
    assert api.post(f"/pulls/{pull['number']}/merge", {"Do": "yolo"}).status_code == 422
    assert api.post("/pulls/999/merge", {"Do": "merge"}).status_code == 404


def test_abandon_leaves_unmerged_and_the_issue_closable(api: Api) -> None:
    number = api.issue("target")
    pull = api.pull(f"fixes #{number}")
    closed = api.patch(f"/pulls/{pull['number']}", {"state": "closed"})
    assert closed.status_code == 201
    body = closed.json()
    assert body["state"] == "closed" and body["merged"] is False
    assert body["merge_commit_sha"] is None and body["closed_at"]
    assert api.get(f"/issues/{number}").json()["state"] == "open"  # only a merge resolves
    assert api.post(f"/pulls/{pull['number']}/merge", {"Do": "merge"}).status_code == 404
    assert api.patch(f"/issues/{number}", {"state": "closed"}).status_code == 201
    entries = api.timeline(number)
    assert [e["type"] for e in entries] == ["pull_ref", "close"]
    assert entries[0]["ref_issue"]["pull_request"]["merged"] is False


def test_edit_body_neuters_old_references(api: Api) -> None:
    old, new = api.issue("old"), api.issue("new")
    pull = api.pull(f"closes #{old}")
    edited = api.patch(f"/pulls/{pull['number']}", {"body": f"closes #{new}"})
    assert edited.status_code == 201
    assert _refs(api, old) == [(pull["number"], "neutered")]
    api.post(f"/pulls/{pull['number']}/merge", {"Do": "squash"})
    assert api.get(f"/issues/{old}").json()["state"] == "open"
    assert api.get(f"/issues/{new}").json()["state"] == "closed"


def test_list_pulls_paged_with_link_and_total(api: Api) -> None:
    for i in range(55):
        api.pull(f"#{i}", head=f"h{i}")
    api.patch("/pulls/1", {"state": "closed"})
    first = api.get("/pulls", limit=100)
    assert len(first.json()) == 50 and first.headers["X-Total-Count"] == "54"
    assert 'rel="next"' in first.headers["Link"] and "page=2" in first.headers["Link"]
    assert [p["number"] for p in first.json()[:2]] == [55, 54]  # newest first
    second = api.get("/pulls", limit=100, page=2)
    assert len(second.json()) == 4 and 'rel="prev"' in second.headers["Link"]
    closed = api.get("/pulls", state="closed")
    assert [p["number"] for p in closed.json()] == [1]
    assert api.get("/pulls", state="all").headers["X-Total-Count"] == "55"
