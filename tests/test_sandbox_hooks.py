"""The sandbox sends webhooks like Gitea and answers the cross-repo issue search."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import requests
from conftest import Receiver, wait_for

from dropbox_eval.sandbox import SandboxForge


def _session(forge: SandboxForge) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"token {forge.token}"
    return session


def _new_repo(forge: SandboxForge, session: requests.Session, name: str) -> str:
    answer = session.post(f"{forge.url}/api/v1/user/repos", json={"name": name}, timeout=30)
    assert answer.status_code == 201, answer.text
    return f"{forge.url}/api/v1/repos/{forge.user}/{name}"


def test_a_user_hook_receives_signed_issue_comment_and_label_events(
    forge: SandboxForge, receiver: Receiver
) -> None:
    session = _session(forge)
    hook = session.post(
        f"{forge.url}/api/v1/user/hooks",
        json={
            "type": "gitea",
            "active": True,
            "events": ["issues", "issue_comment"],
            "config": {"url": receiver.url, "content_type": "json", "secret": "s3cret"},
        },
        timeout=30,
    )
    assert hook.status_code == 201 and "secret" not in hook.json()["config"]
    repo = _new_repo(forge, session, "hooked")
    number = session.post(f"{repo}/issues", json={"title": "t"}, timeout=30).json()["number"]
    forge.finish_issue(forge.user, "hooked", number, comment="done", labels=["eval-pass"])
    assert wait_for(lambda: len(receiver.received) >= 4)
    kinds = [
        (h["x-gitea-event"], h["x-gitea-event-type"], json.loads(b)["action"])
        for h, b in receiver.received
    ]
    assert kinds[0] == ("issues", "issues", "opened")
    assert ("issue_comment", "issue_comment", "created") in kinds
    assert ("issues", "issue_label", "label_updated") in kinds
    assert kinds[-1] == ("issues", "issues", "closed")
    for headers, body in receiver.received:
        expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
        assert headers["x-gitea-signature"] == expected == headers["x-forgejo-signature"]
        assert headers["x-hub-signature-256"] == f"sha256={expected}"
        payload = json.loads(body)
        assert payload["repository"]["full_name"] == f"{forge.user}/hooked"
        assert payload["issue"]["number"] == number and payload["sender"]["login"]
    assert len({h["x-gitea-delivery"] for h, _ in receiver.received}) == len(receiver.received)


def test_hooks_fire_only_for_their_scope_and_events(
    forge: SandboxForge, receiver: Receiver
) -> None:
    session = _session(forge)
    repo = _new_repo(forge, session, "scoped")
    _new_repo(forge, session, "other")
    created = session.post(
        f"{repo}/hooks",
        json={
            "type": "gitea",
            "active": True,
            "events": ["issue_comment"],
            "config": {"url": receiver.url},
        },
        timeout=30,
    )
    assert created.status_code == 201
    other = f"{forge.url}/api/v1/repos/{forge.user}/other"
    number = session.post(f"{other}/issues", json={"title": "x"}, timeout=30).json()["number"]
    session.post(f"{other}/issues/{number}/comments", json={"body": "hi"}, timeout=30)
    own = session.post(f"{repo}/issues", json={"title": "y"}, timeout=30).json()["number"]
    session.post(f"{repo}/issues/{own}/comments", json={"body": "hi"}, timeout=30)
    assert wait_for(lambda: len(receiver.received) == 1)
    time.sleep(0.3)
    assert len(receiver.received) == 1
    assert receiver.received[0][0]["x-gitea-event"] == "issue_comment"
    assert "x-gitea-signature" not in receiver.received[0][0]  # no secret, no signature
    hook_id = created.json()["id"]
    assert session.delete(f"{repo}/hooks/{hook_id}", timeout=30).status_code == 204
    assert session.get(f"{repo}/hooks", timeout=30).json() == []


def test_search_spans_the_owner_s_repos_and_lags_like_an_indexer(forge: SandboxForge) -> None:
    session = _session(forge)
    for name in ("s1", "s2"):
        repo = _new_repo(forge, session, name)
        label = session.post(
            f"{repo}/labels", json={"name": "eval-task", "color": "ff0000"}, timeout=30
        ).json()["id"]
        session.post(f"{repo}/issues", json={"title": name, "labels": [label]}, timeout=30)
    search = f"{forge.url}/api/v1/repos/issues/search"
    params = {
        "owner": forge.user,
        "state": "open",
        "labels": "eval-task",
        "type": "issues",
        "limit": 1,
    }
    first = session.get(search, params=params, timeout=30)
    assert first.json()[0]["repository"]["full_name"] == f"{forge.user}/s2"  # newest first
    assert first.headers["X-Total-Count"] == "2" and 'rel="next"' in first.headers["Link"]
    forge.state.indexer_lag = 1.0
    session.post(
        f"{forge.url}/api/v1/repos/{forge.user}/s1/issues", json={"title": "new"}, timeout=30
    )
    everything = {**params, "labels": "", "limit": 50}

    def titles() -> list[str]:
        return [i["title"] for i in session.get(search, params=everything, timeout=30).json()]

    assert "new" not in titles()  # not indexed yet
    assert wait_for(lambda: "new" in titles())
