"""The sandbox's service capacity: at most n API requests served at once, the rest wait
(the bench's forge whose latency grows with load); the request log filtered by path."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

import pytest
import requests
from conftest import wait_for
from sandbox_client import new_api

from dropbox_eval.errors import ConfigError
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sandbox.options import SandboxOptions


@contextmanager
def unfinished_post(forge: SandboxForge, path: str) -> Iterator[None]:
    """A POST whose body never completes: its handler holds a slot until we hang up."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: token {forge.token}\r\nContent-Type: application/json\r\n"
        'Content-Length: 1000\r\n\r\n{"title": '
    )
    host, port = forge.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(head.encode())
        yield


def test_requests_beyond_the_capacity_wait_for_a_slot(forge: SandboxForge) -> None:
    api = new_api(forge)
    path = f"/api/v1/repos/{api.owner}/{api.repo}/issues"
    capacity = forge.state.faults.capacity
    forge.set_capacity(1)
    forge.clear_requests()
    with ExitStack() as first:
        first.enter_context(unfinished_post(forge, path))
        assert wait_for(lambda: capacity.serving == 1, timeout=30)
        with unfinished_post(forge, path):
            assert forge.wait_for_request("POST", "/issues", timeout=30, count=2)
            assert capacity.serving == 1  # the second arrived and waits outside
            first.close()  # the first client hangs up: the second gets the slot
            assert wait_for(lambda: [e.status for e in forge.requests] == [499], timeout=30)
            assert wait_for(lambda: capacity.serving == 1, timeout=30)
    assert wait_for(lambda: capacity.serving == 0, timeout=30)
    assert capacity.peak == 1
    assert forge.issues(api.owner, api.repo) == []


def test_without_a_capacity_requests_are_served_together(forge: SandboxForge) -> None:
    api = new_api(forge)
    path = f"/api/v1/repos/{api.owner}/{api.repo}/issues"
    capacity = forge.state.faults.capacity
    assert capacity.limit == 0  # the default: no limit
    with unfinished_post(forge, path), unfinished_post(forge, path):
        assert wait_for(lambda: capacity.serving == 2, timeout=30)
    assert wait_for(lambda: capacity.serving == 0, timeout=30)
    assert capacity.peak == 2


def test_the_slot_is_held_through_the_delay(forge: SandboxForge) -> None:
    forge.set_capacity(1)
    forge.set_delay(0.2)

    def version(_: int) -> int:
        return requests.get(f"{forge.url}/api/v1/version", timeout=60).status_code

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(version, range(3))) == [200, 200, 200]
    assert forge.state.faults.capacity.peak == 1
    forge.state.faults.clear()  # faults and the delay go; the capacity is not a fault
    assert forge.state.faults.capacity.limit == 1


def test_capacity_from_the_environment() -> None:
    options = SandboxOptions.from_env({"SANDBOX_CAPACITY": "24"})
    assert SandboxForge.from_env(options=options).state.faults.capacity.limit == 24
    with pytest.raises(ConfigError, match="SANDBOX_CAPACITY"):
        SandboxOptions.from_env({"SANDBOX_CAPACITY": "-1"})


def test_request_log_filtered_by_path(forge: SandboxForge) -> None:
    first, second = new_api(forge), new_api(forge)
    forge.clear_requests()
    first.get("/issues")
    second.get("/issues")
    second.get("/labels")
    url = f"{forge.url}/_sandbox/requests"
    only = requests.get(url, params={"path_contains": f"/{second.repo}/"}, timeout=30).json()
    assert [e["path"].rsplit("/", 1)[1] for e in only] == ["issues", "labels"]
    started = requests.get(
        url, params={"phase": "started", "path_contains": "/labels"}, timeout=30
    ).json()
    assert [e["path"] for e in started] == [f"/api/v1/repos/{second.owner}/{second.repo}/labels"]
