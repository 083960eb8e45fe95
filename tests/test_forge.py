"""GiteaClient against the sandbox forge over loopback: paging, retries, error translation."""

from __future__ import annotations

import socket
import struct
import threading
from datetime import timedelta

import pytest
import requests

from dropbox_eval.errors import ForgeAuthError, ForgeNotFound, ForgeRetryable
from dropbox_eval.forge import ForgeIssue, GiteaClient
from dropbox_eval.models import utcnow
from dropbox_eval.sandbox import SandboxForge


@pytest.fixture
def client(forge: SandboxForge, sleeps: list[float]) -> GiteaClient:
    return GiteaClient(forge.url, forge.token, sleep=sleeps.append, attempts=4)


def test_lists_every_page_despite_the_50_cap(client: GiteaClient, forge: SandboxForge) -> None:
    repo = f"{forge.user}/paging"
    client.ensure_repo(repo)
    label = client.ensure_label(repo, "eval-task", "5319e7")
    for i in range(120):
        client.create_issue(repo, f"issue {i}", "body", [label])
    forge.clear_requests()
    numbers = [issue.number for issue in client.iter_issues(repo, labels="eval-task")]
    assert sorted(numbers) == list(range(1, 121))
    pages = [r for r in forge.requests if r.path.endswith("/issues")]
    assert len(pages) == 3
    assert all("limit=50" in r.query for r in pages), pages


def test_ensure_label_and_repo_are_idempotent(client: GiteaClient, forge: SandboxForge) -> None:
    repo = f"{forge.user}/labels"
    url = client.ensure_repo(repo)
    assert client.ensure_repo(repo) == url
    first = client.ensure_label(repo, "eval-task", "#abc")
    assert client.ensure_label(repo, "eval-task", "#abc") == first
    listed = requests.get(
        f"{forge.url}/api/v1/repos/{repo}/labels",
        headers={"Authorization": f"token {forge.token}"},
        timeout=5,
    ).json()
    assert [lab["id"] for lab in listed if lab["name"] == "eval-task"] == [first]


def test_org_repo_is_created_under_the_org(client: GiteaClient, forge: SandboxForge) -> None:
    url = client.ensure_repo("evalorg/shared")
    assert url.endswith("/evalorg/shared")


def test_retries_503_honouring_retry_after(
    client: GiteaClient, forge: SandboxForge, sleeps: list[float]
) -> None:
    forge.fail_next(2, 503, retry_after=7)
    assert client.version()
    assert sleeps == [7.0, 7.0]


def test_gives_up_after_attempts(
    client: GiteaClient, forge: SandboxForge, sleeps: list[float]
) -> None:
    forge.fail_next(10, 502)
    with pytest.raises(ForgeRetryable) as caught:
        client.login()
    assert caught.value.status == 502
    assert len(sleeps) == 3 and all(0 < s <= 30 for s in sleeps)


def test_create_is_not_retried_blindly(
    client: GiteaClient, forge: SandboxForge, sleeps: list[float]
) -> None:
    repo = f"{forge.user}/once"
    client.ensure_repo(repo)
    forge.fail_next(1, 500, path_contains="/issues")
    with pytest.raises(ForgeRetryable):
        client.create_issue(repo, "t", "b", [])
    assert sleeps == []


def test_bad_token_and_missing_issue(forge: SandboxForge) -> None:
    bad = GiteaClient(forge.url, "wrong")
    with pytest.raises(ForgeAuthError, match="SAAS_EVAL_GITEA_TOKEN"):
        bad.login()
    good = GiteaClient(forge.url, forge.token, sleep=lambda _: None, attempts=2)
    repo = f"{forge.user}/gone"
    good.ensure_repo(repo)
    with pytest.raises(ForgeNotFound):
        good.get_issue(repo, 99)
    gone = ForgeIssue(
        number=99, title="", state="closed", labels=[], html_url="", updated_at=utcnow()
    )
    with pytest.raises(ForgeNotFound):
        good.timeline(repo, gone)  # Gitea answers 500 here; the client checks the issue


def test_since_is_sent_as_strict_rfc3339(client: GiteaClient, forge: SandboxForge) -> None:
    repo = f"{forge.user}/since"
    client.ensure_repo(repo)
    client.create_issue(repo, "old", "b", [])
    later = utcnow() + timedelta(hours=1)
    assert list(client.iter_issues(repo, since=later)) == []
    assert len(list(client.iter_issues(repo, since=later - timedelta(hours=2)))) == 1


def test_timeout_is_retryable(forge: SandboxForge, sleeps: list[float]) -> None:
    slow = GiteaClient(forge.url, forge.token, timeout=0.2, attempts=2, sleep=sleeps.append)
    forge.set_delay(0.5)
    with pytest.raises(ForgeRetryable, match="timed out"):
        slow.version()
    assert len(sleeps) == 1


def test_connection_reset_is_retryable(sleeps: list[float]) -> None:
    """A server that accepts and hangs up at once, like a forge restarting."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def hang_up() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            reset_on_close = struct.pack("ii", 1, 0)  # linger 0: close sends RST
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset_on_close)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        client = GiteaClient(f"http://127.0.0.1:{port}", "t", attempts=3, sleep=sleeps.append)
        with pytest.raises(ForgeRetryable, match="unreachable"):
            client.version()
        assert len(sleeps) == 2
    finally:
        listener.close()
