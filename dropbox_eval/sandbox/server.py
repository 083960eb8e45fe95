"""`SandboxForge`: the sandbox app served by uvicorn on loopback in a background thread."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from .app import create_app
from .faults import RequestLogEntry
from .lane import SimulatedLane
from .state import ForgeState


class SandboxForge:
    """A Gitea-compatible forge on 127.0.0.1, optionally with a simulated lane."""

    def __init__(
        self, *, port: int = 0, token: str = "sandbox-token", user: str = "eval",
        lane_delay: float | None = None, lane_interval: float = 0.1,
    ) -> None:
        self.port = port
        self.token = token
        self.user = user
        self.url = f"http://127.0.0.1:{port}"
        self.state = ForgeState(token=token, user=user, base_url=self.url)
        self.lane: SimulatedLane | None = None
        if lane_delay is not None:
            self.lane = SimulatedLane(self.state, lane_delay, lane_interval)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> SandboxForge:
        """Serve in a background thread and wait until the socket is bound."""
        if self._server is not None:
            return self
        config = uvicorn.Config(create_app(self.state), host="127.0.0.1", port=self.port,
                                log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="sandbox-forge", daemon=True)
        thread.start()
        _wait_started(server, thread)
        self._server, self._thread = server, thread
        self.port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.state.base_url = self.url
        if self.lane is not None:
            self.lane.start()
        return self

    def stop(self) -> None:
        """Stop the lane and the server."""
        if self.lane is not None:
            self.lane.stop()
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> SandboxForge:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def requests(self) -> list[RequestLogEntry]:
        """Copy of the API request log."""
        return self.state.log.entries()

    def clear_requests(self) -> None:
        """Forget the API request log."""
        self.state.log.clear()

    def finish_issue(
        self, owner: str, repo: str, number: int, *, comment: str | None, labels: list[str]
    ) -> None:
        """Act as the lane: comment (as lane-bot), add labels by name, close."""
        self.state.finish_issue(owner, repo, number, comment=comment, labels=labels)

    def delete_issue(self, owner: str, repo: str, number: int) -> None:
        """Delete an issue as an admin would."""
        self.state.delete_issue(owner, repo, number)

    def issues(self, owner: str, repo: str) -> list[dict[str, Any]]:
        """All issues of a repo as the API renders them, in creation order."""
        return self.state.all_issues(owner, repo)

    def fail_next(
        self, count: int, status: int = 503, *, retry_after: int | None = None,
        path_contains: str = "",
    ) -> None:
        """The next `count` matching API requests answer `status` without side effects."""
        self.state.faults.fail_next(count, status, retry_after=retry_after,
                                    path_contains=path_contains)

    def set_delay(self, seconds: float) -> None:
        """Every API request sleeps `seconds` before answering."""
        self.state.faults.delay = max(0.0, seconds)

    def fail_for(self, seconds: float, status: int = 503) -> None:
        """Every API request answers `status` for the next `seconds`."""
        self.state.faults.fail_for(seconds, status)


def _wait_started(server: uvicorn.Server, thread: threading.Thread, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("sandbox forge failed to start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("sandbox forge did not start in time")
        time.sleep(0.01)
