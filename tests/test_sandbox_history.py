"""The sandbox plays histories real forges have: comment deletes, repo transfers,
users acting with their own tokens, and a lagging search index; over loopback HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from sandbox_client import Api, new_api, schema_errors, session

from dropbox_eval.sandbox import HUMAN, LANE_BOT, ManualClock, SandboxForge


def _comment(api: Api, who: requests.Session, number: int, body: str) -> int:
    answer = who.post(f"{api.repo_url}/issues/{number}/comments", json={"body": body}, timeout=30)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def test_a_deleted_comment_leaves_comments_and_timeline_and_only_its_poster_or_a_writer_may(
    forge: SandboxForge,
) -> None:
    api = new_api(forge)
    alice = session(forge.users[HUMAN])
    number = api.issue("task")
    mine = _comment(api, api.session, number, "owner's note")
    hers = _comment(api, alice, number, "alice's note")
    kept = _comment(api, alice, number, "stays")
    before = api.get(f"/issues/{number}").json()["updated_at"]
    url = f"{api.repo_url}/issues/comments"

    refused = alice.delete(f"{url}/{mine}", timeout=30)  # not hers, no write on eval's repo
    assert refused.status_code == 403 and refused.content == b""  # ctx.Status(403)
    unknown = api.session.delete(f"{url}/999999", timeout=30)
    assert unknown.status_code == 404
    assert unknown.json()["message"] == "not found"
    assert unknown.json()["errors"] == ["comment does not exist [id: 999999, issue_id: 0]"]
    other = new_api(forge)
    elsewhere = other.session.delete(f"{other.repo_url}/issues/comments/{mine}", timeout=30)
    assert elsewhere.status_code == 404 and elsewhere.content == b""  # another repo's comment

    assert api.session.delete(f"{url}/{hers}", timeout=30).status_code == 204  # a writer
    own = alice.delete(f"{api.repo_url}/issues/{number}/comments/{kept}", timeout=30)
    assert own.status_code == 204  # her own, through the deprecated path
    assert api.session.delete(f"{url}/{hers}", timeout=30).status_code == 404  # gone

    bodies = [c["body"] for c in api.get(f"/issues/{number}/comments").json()]
    assert bodies == ["owner's note"]
    timeline = api.timeline(number)
    assert [e["id"] for e in timeline if e["type"] == "comment"] == [mine]  # no trace left
    issue = api.get(f"/issues/{number}").json()
    assert issue["updated_at"] == before and issue["comments"] == 1
    assert not schema_errors("Issue", issue)


def test_a_transferred_repo_answers_202_and_its_old_path_redirects_with_307(
    forge: SandboxForge,
) -> None:
    api = new_api(forge)
    number = api.issue("moving")
    alice = session(forge.users[HUMAN])
    transfer = f"{api.repo_url}/transfer"
    refused = alice.post(transfer, json={"new_owner": HUMAN}, timeout=30)
    assert refused.status_code == 403
    assert refused.json()["message"] == "user should be the owner of the repo"
    nobody = api.session.post(transfer, json={"new_owner": "nobody"}, timeout=30)
    assert nobody.status_code == 404
    assert nobody.json()["message"] == "The new owner does not exist or cannot be found"
    assert api.session.post(transfer, json={}, timeout=30).status_code == 422

    moved = api.session.post(transfer, json={"new_owner": "evalorg"}, timeout=30)
    assert moved.status_code == 202, moved.text
    assert moved.json()["owner"]["login"] == "evalorg"
    assert moved.json()["full_name"] == f"evalorg/{api.repo}"
    assert not schema_errors("Repository", moved.json())

    old = f"{api.repo_url}/issues/{number}?state=all"
    redirect = api.session.get(old, allow_redirects=False, timeout=30)
    assert redirect.status_code == 307
    assert (
        redirect.headers["Location"]
        == f"/api/v1/repos/evalorg/{api.repo}/issues/{number}?state=all"
    )
    followed = api.session.get(old, timeout=30)
    assert followed.status_code == 200 and followed.json()["title"] == "moving"
    assert followed.json()["repository"]["full_name"] == f"evalorg/{api.repo}"
    search = f"{api.base}/repos/issues/search"
    found = api.session.get(search, params={"owner": "evalorg", "state": "all"}, timeout=30)
    assert [i["number"] for i in found.json()] == [number]
    mine = api.session.get(search, params={"owner": forge.user, "state": "all"}, timeout=30)
    assert mine.json() == []

    retaken = api.session.post(f"{api.base}/user/repos", json={"name": api.repo}, timeout=30)
    assert retaken.status_code == 201  # the old name is free again (no redirect now)
    clash = api.session.post(
        f"{api.base}/repos/{forge.user}/{api.repo}/transfer",
        json={"new_owner": "evalorg"},
        timeout=30,
    )
    assert clash.status_code == 422


def test_each_token_acts_as_its_user_in_comments_labels_and_closes(forge: SandboxForge) -> None:
    api = new_api(forge)
    users = forge.users
    assert set(users) == {forge.user, LANE_BOT, HUMAN} and users[forge.user] == forge.token
    alice, lane = session(users[HUMAN]), session(users[LANE_BOT])
    assert alice.get(f"{api.base}/user", timeout=30).json()["login"] == HUMAN
    assert lane.get(f"{api.base}/user", timeout=30).json()["login"] == LANE_BOT
    label = api.label("eval-pass")
    number = api.issue("task")
    _comment(api, lane, number, "PASS")
    added = lane.post(
        f"{api.repo_url}/issues/{number}/labels", json={"labels": [label]}, timeout=30
    )
    assert added.status_code == 200
    closed = alice.patch(f"{api.repo_url}/issues/{number}", json={"state": "closed"}, timeout=30)
    assert closed.status_code == 201
    actors = [(e["type"], e["user"]["login"]) for e in api.timeline(number)]
    assert actors == [("comment", LANE_BOT), ("label", LANE_BOT), ("close", HUMAN)]


@pytest.fixture
def manual() -> Iterator[tuple[SandboxForge, ManualClock]]:
    clock = ManualClock()
    with SandboxForge(port=0, clock=clock) as running:
        yield running, clock


def test_a_lagging_index_matches_issues_as_they_stood_seconds_ago(
    manual: tuple[SandboxForge, ManualClock],
) -> None:
    forge, clock = manual
    api = new_api(forge)
    label = api.label("eval-pass")
    number = api.issue("old")
    clock.advance(100)
    api.post(f"/issues/{number}/labels", {"labels": [label]})
    api.patch(f"/issues/{number}", {"state": "closed"})
    clock.advance(5)
    fresh = api.issue("fresh")
    lagged = requests.post(f"{forge.url}/_sandbox/index_lag", json={"seconds": 30}, timeout=30)
    assert lagged.status_code == 200 and lagged.json()["seconds"] == 30

    def search(**params: str) -> list[dict[str, object]]:
        query = {"owner": forge.user, "type": "issues", **params}
        answer = api.session.get(f"{api.base}/repos/issues/search", params=query, timeout=30)
        assert answer.status_code == 200, answer.text
        found: list[dict[str, object]] = answer.json()
        return found

    opened = search(state="open")  # indexed while open; the body is read now: closed
    assert [(i["number"], i["state"]) for i in opened] == [(number, "closed")]
    assert search(state="closed") == [] and search(state="all", labels="eval-pass") == []
    clock.advance(31)
    assert [i["number"] for i in search(state="closed", labels="eval-pass")] == [number]
    assert [i["number"] for i in search(state="open")] == [fresh]
    forge.set_index_lag(0)
    assert len(search(state="all")) == 2


def test_the_sandbox_command_prints_the_lane_s_and_a_human_s_tokens() -> None:
    env = {**os.environ, "SANDBOX_LANE_HELD": "false"}
    command = [sys.executable, "-m", "dropbox_eval", "sandbox", "--port", "0", "--lane-delay", "-1"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            shown = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(7))
            assert shown["SAAS_EVAL_LANE_LOGIN"] == LANE_BOT and shown["SANDBOX_HUMAN"] == HUMAN
            url = shown["SAAS_EVAL_GITEA_URL"]
            for token, login in (
                (shown["SAAS_EVAL_GITEA_TOKEN"], shown["SAAS_EVAL_OWNER"]),
                (shown["SANDBOX_LANE_TOKEN"], LANE_BOT),
                (shown["SANDBOX_HUMAN_TOKEN"], HUMAN),
            ):
                user = session(token).get(f"{url}/api/v1/user", timeout=30)
                assert user.status_code == 200 and user.json()["login"] == login
        finally:
            proc.terminate()
