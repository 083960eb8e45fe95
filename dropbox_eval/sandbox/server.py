"""`SandboxForge`: the sandbox app served by uvicorn on loopback in a background thread."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from ..webserver import BackgroundServer
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
        self._server: BackgroundServer | None = None

    def start(self) -> SandboxForge:
        """Serve in a background thread and wait until the socket is bound."""
        if self._server is not None:
            return self
        server = BackgroundServer(create_app(self.state), port=self.port, name="sandbox-forge")
        self.url = server.start()
        self._server, self.port = server, server.port
        self.state.base_url = self.url
        if self.lane is not None:
            self.lane.start()
        return self

    def stop(self) -> None:
        """Stop the lane and the server."""
        if self.lane is not None:
            self.lane.stop()
        if self._server is not None:
            self._server.stop()
        self._server = None

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
