"""GiteaClient against the sandbox forge over loopback: paging, error translation, and each
exchange tried once (attempts.py decides any next try, on the batch)."""

from __future__ import annotations

import socket
import struct
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from dropbox_eval.errors import ForgeAuthError, ForgeNotFound, ForgeRetryable
from dropbox_eval.forge.client import ForgeIssue, GiteaClient
from dropbox_eval.forge.transport import forge_outcome
from dropbox_eval.models import utcnow
from dropbox_eval.sandbox import SandboxForge


@pytest.fixture
def client(forge: SandboxForge) -> GiteaClient:
    return GiteaClient(forge.url, forge.token)


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
        timeout=30,
    ).json()
    assert [lab["id"] for lab in listed if lab["name"] == "eval-task"] == [first]


def test_org_repo_is_created_under_the_org(client: GiteaClient, forge: SandboxForge) -> None:
    url = client.ensure_repo("evalorg/shared")
    assert url.endswith("/evalorg/shared")


def test_a_503_is_tried_once_and_carries_the_retry_after(
    client: GiteaClient, forge: SandboxForge
) -> None:
    forge.fail_next(2, 503, retry_after=7)
    forge.clear_requests()
    with pytest.raises(ForgeRetryable) as caught:
        client.version()
    assert (caught.value.status, caught.value.retry_after) == (503, 7.0)
    assert len(forge.requests) == 1  # no loop: the durable schedule decides the next try
    assert forge_outcome(caught.value).overloaded  # and the in-flight budget backs off


def test_a_502_is_retryable_and_a_404_is_not_overload(
    client: GiteaClient, forge: SandboxForge
) -> None:
    forge.fail_next(1, 502)
    with pytest.raises(ForgeRetryable) as caught:
        client.login()
    assert caught.value.status == 502
    with pytest.raises(ForgeNotFound) as missing:
        client.get_issue(f"{forge.user}/nowhere", 1)
    assert not forge_outcome(missing.value).overloaded


def test_create_is_not_retried_blindly(client: GiteaClient, forge: SandboxForge) -> None:
    repo = f"{forge.user}/once"
    client.ensure_repo(repo)
    forge.fail_next(1, 500, path_contains="/issues")
    forge.clear_requests()
    with pytest.raises(ForgeRetryable):
        client.create_issue(repo, "t", "b", [])
    assert [r.method for r in forge.requests] == ["POST"]


def test_bad_token_and_missing_issue(forge: SandboxForge) -> None:
    bad = GiteaClient(forge.url, "wrong")
    with pytest.raises(ForgeAuthError, match="SAAS_EVAL_GITEA_TOKEN"):
        bad.login()
    good = GiteaClient(forge.url, forge.token)
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


def test_timeout_is_retryable(forge: SandboxForge) -> None:
    slow = GiteaClient(forge.url, forge.token, timeout=0.2)
    forge.set_delay(2.0)
    with pytest.raises(ForgeRetryable, match="timed out") as caught:
        slow.version()
    assert forge_outcome(caught.value).overloaded


def test_connection_reset_is_retryable() -> None:
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
        client = GiteaClient(f"http://127.0.0.1:{port}", "t")
        with pytest.raises(ForgeRetryable, match="unreachable"):
            client.version()
    finally:
        listener.close()


def test_the_environment_is_read_once_and_a_netrc_never_replaces_the_token(
    forge: SandboxForge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password wrong\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # refused, were it used
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    client = GiteaClient(forge.url, forge.token)
    monkeypatch.delenv("NO_PROXY")  # read when the client was made, not at each call
    assert client.ensure_repo(f"{forge.user}/environment").endswith("/environment")
