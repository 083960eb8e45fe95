"""Black-box control of the sandbox: method-matched faults and the request-start log."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import requests
from conftest import PATIENCE, wait_for
from sandbox_client import Api, new_api

from dropbox_eval.sandbox import SandboxForge


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxForge]:
    with SandboxForge(port=0) as running:
        yield running


@pytest.fixture
def api(sandbox: SandboxForge) -> Api:
    return new_api(sandbox)


def test_fault_matched_by_method_leaves_listings_alone(api: Api) -> None:
    api.forge.fail_next(1, 413, path_contains="/issues", method="post")
    assert api.get("/issues").status_code == 200  # a GET does not consume the POST fault
    assert api.post("/issues", {"title": "big"}).status_code == 413
    assert api.forge.issues(api.owner, api.repo) == []  # no side effect
    assert api.post("/issues", {"title": "small"}).status_code == 201


def test_fault_method_over_the_control_route(api: Api) -> None:
    added = requests.post(
        f"{api.forge.url}/_sandbox/faults",
        timeout=30,
        json={"count": 2, "status": 503, "path_contains": "/labels", "method": "GET"},
    )
    assert added.status_code == 200
    assert api.post("/labels", {"name": "a", "color": "fff"}).status_code == 201
    assert [api.get("/labels").status_code for _ in range(3)] == [503, 503, 200]


def test_request_is_logged_when_it_starts(api: Api) -> None:
    api.forge.clear_requests()
    path = f"/api/v1/repos/{api.owner}/{api.repo}/issues"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: token {api.forge.token}\r\nContent-Type: application/json\r\n"
        'Content-Length: 1000\r\n\r\n{"title": '
    )
    host, port = api.forge.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=PATIENCE) as client:
        client.sendall(head.encode())  # the body never completes: the handler is waiting
        assert api.forge.wait_for_request("POST", "/issues", timeout=PATIENCE)
        assert [(e.method, e.path) for e in api.forge.started_requests] == [("POST", path)]
        assert api.forge.requests == []  # started, not answered
        started = requests.get(
            f"{api.forge.url}/_sandbox/requests", params={"phase": "started"}, timeout=30
        ).json()
        assert started == [{"method": "POST", "path": path, "query": ""}]
    assert wait_for(lambda: [e.status for e in api.forge.requests] == [499])
    assert api.forge.issues(api.owner, api.repo) == []


def test_wait_for_request_times_out_and_counts(api: Api) -> None:
    assert not api.forge.wait_for_request("DELETE", "/issues", timeout=0.05)
    api.get("/issues")
    api.get("/issues")
    assert api.forge.wait_for_request("get", "/issues", timeout=PATIENCE, count=2)
    api.forge.clear_requests()
    assert api.forge.started_requests == []
