"""The sandbox forge in a child process (its own GIL and core), driven over its control
routes: delay, capacity, faults and the request log.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from types import TracebackType
from typing import Any

import requests

DELAY = 0.1  # seconds per request: the knee sits near CAPACITY threads, 160 requests/s
CAPACITY = 16

_FORGE_CHILD = """
import os, sys
from dropbox_eval.sandbox import SandboxForge
lane = os.environ.get("BENCH_LANE_DELAY")
with SandboxForge.from_env(port=0, lane_delay=None if lane is None else float(lane)) as forge:
    print(forge.url, forge.token, forge.user, flush=True)
    sys.stdin.read()
"""


class ForgeProcess:
    """A `SandboxForge` served by a child process; `capacity` (SANDBOX_CAPACITY: API
    requests served at once, 0 for no limit) and `delay` (seconds before each answer) make
    a forge whose throughput tops out near capacity / delay and whose latency grows past it.
    With `lane_delay`, the sandbox's lane closes each task issue that many seconds after it
    was opened (pass label and comment, looked at every 0.1 s); without, nothing closes.
    """

    def __init__(
        self, *, capacity: int = 0, delay: float = 0.0, lane_delay: float | None = None
    ) -> None:
        self.url = self.token = self.user = ""
        self.capacity = capacity
        self.delay = delay
        self.lane_delay = lane_delay
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ForgeProcess:
        env = {**os.environ, "SANDBOX_CAPACITY": str(self.capacity)}
        if self.lane_delay is not None:
            env["BENCH_LANE_DELAY"] = str(self.lane_delay)
        self._proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _FORGE_CHILD],  # -P: the installed package
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().split()
        if len(line) != 3:
            self._proc.kill()
            raise RuntimeError("sandbox forge process did not start")
        self.url, self.token, self.user = line
        if self.delay:
            self.set_delay(self.delay)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def control(self, method: str, route: str, **kwargs: Any) -> Any:
        """One call to a `/_sandbox/<route>` control route; its JSON answer."""
        response = requests.request(method, f"{self.url}/_sandbox/{route}", timeout=60, **kwargs)
        response.raise_for_status()
        return response.json()

    def requests(self, path_contains: str = "") -> list[dict[str, Any]]:
        """The forge's API request log (method, path, status, query), or only the requests
        whose path contains `path_contains`."""
        params = {"path_contains": path_contains} if path_contains else {}
        entries: list[dict[str, Any]] = self.control("GET", "requests", params=params)
        return entries

    def clear_requests(self) -> None:
        """Forget the forge's API request log."""
        self.control("DELETE", "requests")

    def set_delay(self, seconds: float) -> None:
        """Every API request waits `seconds` (holding its capacity slot) before answering."""
        self.control("POST", "delay", json={"seconds": seconds})

    def fail_for(self, seconds: float, status: int = 503) -> None:
        """Every API request answers `status` for the next `seconds`."""
        self.control("POST", "fail_for", json={"seconds": seconds, "status": status})

    def fail_next(self, count: int, status: int = 503, path_contains: str = "") -> None:
        """The next `count` API requests whose path contains `path_contains` fail."""
        body = {"count": count, "status": status, "path_contains": path_contains}
        self.control("POST", "faults", json=body)


def forge_arguments(parser: argparse.ArgumentParser) -> None:
    """`--delay` and `--capacity`: the forge with a knee that the flow benches share."""
    parser.add_argument(
        "--delay", type=float, default=DELAY, help=f"seconds per request (default {DELAY})"
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=CAPACITY,
        help=f"API requests the forge serves at once (default {CAPACITY})",
    )


def forge_note(args: argparse.Namespace) -> str:
    """The forge's configuration, for a bench's printed set-up."""
    return (
        f"sandbox forge in its own process, delay {args.delay * 1000:.0f} ms, capacity "
        f"{args.capacity} (ceiling {args.capacity / args.delay:.0f} requests/s)"
    )
