"""`SandboxForge`: the sandbox app served by uvicorn on loopback in a background thread."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from ..util.webserver import BackgroundServer
from .app import create_app
from .clock import Clock
from .faults import RequestLogEntry, RequestStart
from .flavor import Flavor, FlavorName
from .lane import SimulatedLane
from .lane_config import LaneConfig
from .options import SandboxOptions
from .state import ForgeState

# seconds an idle connection stays open: a Gitea behind nginx (its default keepalive_timeout
# is 75 s), not uvicorn's 5 s, whose closes raced a client's reuse of a connection in a burst
KEEP_ALIVE = 75


class SandboxForge:
    """A Gitea- or Forgejo-flavoured forge on 127.0.0.1, optionally with a simulated lane.

    `lane` (a `LaneConfig`) wins over `lane_delay`/`lane_interval`; `hold_lane` starts with
    every issue held until released; `clock` (e.g. a `ManualClock`) stamps every change and
    the `Date` header instead of the machine's clock.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        token: str = "sandbox-token",
        user: str = "eval",
        lane_delay: float | None = None,
        lane_interval: float = 0.1,
        flavor: FlavorName = "gitea",
        repo_quota: int | None = None,
        lane: LaneConfig | None = None,
        hold_lane: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.port = port
        self.token = token
        self.user = user
        self.url = f"http://127.0.0.1:{port}"
        self.state = ForgeState(
            token=token,
            user=user,
            base_url=self.url,
            flavor=Flavor(flavor, repo_quota),
            clock=clock,
        )
        self.lane: SimulatedLane | None = None
        if lane is None and lane_delay is not None:
            lane = LaneConfig(delay=lane_delay, interval=lane_interval)
        if lane is not None:
            self.lane = SimulatedLane(self.state, config=lane, hold_all=hold_lane)
        self._server: BackgroundServer | None = None

    @classmethod
    def from_env(
        cls,
        *,
        port: int = 0,
        lane_delay: float | None = None,
        options: SandboxOptions | None = None,
    ) -> SandboxForge:
        """A forge configured by `SANDBOX_*` variables (see `options`); no lane if
        `lane_delay` is None. ConfigError on a bad variable."""
        opts = options or SandboxOptions.from_env()
        lane = None if lane_delay is None else opts.lane_config(lane_delay)
        forge = cls(
            port=port,
            flavor=opts.flavor,
            repo_quota=opts.repo_quota,
            lane=lane,
            hold_lane=opts.lane_held,
        )
        forge.set_capacity(opts.capacity)
        return forge

    def start(self) -> SandboxForge:
        """Serve in a background thread and wait until the socket is bound."""
        if self._server is not None:
            return self
        app = create_app(self.state, self.lane)
        server = BackgroundServer(
            app, port=self.port, name="sandbox-forge", date_header=False, keep_alive=KEEP_ALIVE
        )
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
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def requests(self) -> list[RequestLogEntry]:
        """Copy of the API request log."""
        return self.state.log.entries()

    @property
    def started_requests(self) -> list[RequestStart]:
        """Copy of the log of API requests as they arrived (answered or not)."""
        return self.state.log.started()

    def wait_for_request(
        self, method: str, path_contains: str, timeout: float = 5.0, count: int = 1
    ) -> bool:
        """Block until `count` matching API requests have *started*; False on timeout."""
        return self.state.log.wait_started(method, path_contains, timeout, count)

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
        self,
        count: int,
        status: int = 503,
        *,
        retry_after: int | None = None,
        path_contains: str = "",
        method: str = "",
    ) -> None:
        """The next `count` API requests matching path (and `method`, if given) answer
        `status` without side effects."""
        self.state.faults.fail_next(
            count, status, retry_after=retry_after, path_contains=path_contains, method=method
        )

    def set_delay(self, seconds: float) -> None:
        """Every API request sleeps `seconds` before answering."""
        self.state.faults.delay = max(0.0, seconds)

    def fail_for(self, seconds: float, status: int = 503) -> None:
        """Every API request answers `status` for the next `seconds`."""
        self.state.faults.fail_for(seconds, status)

    def set_index_lag(self, seconds: float) -> None:
        """`/repos/issues/search` matches issues as they stood `seconds` ago."""
        self.state.indexer_lag = max(0.0, seconds)

    @property
    def users(self) -> dict[str, str]:
        """Each user's login -> API token: the service's user, the lane's and a human's."""
        return self.state.users()

    def set_capacity(self, requests: int) -> None:
        """At most `requests` API requests are served at once (each holding its slot for
        the delay and the answer), the rest wait their turn; 0: no limit. With delay d
        and capacity c, throughput tops out near c/d and latency climbs past it."""
        self.state.faults.capacity.set(requests)
