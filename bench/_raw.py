"""The baseline client: a plain `requests` loop creating one issue per task (repo + label
first), `threads` threads, one Session per thread; and the sweep that finds the forge's
knee (the thread count with the best throughput).

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import requests
from _common import Stopwatch

from dropbox_eval.forge.markers import issue_body
from dropbox_eval.intake.opening import LABEL_COLOR
from dropbox_eval.models import TaskSpec


class Forge(Protocol):
    """A forge's address and credentials."""

    url: str
    token: str
    user: str


@dataclass
class RawRun:
    """One raw loop: wall time and each issue creation's latency, in seconds."""

    threads: int
    tasks: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        """Issues created per second."""
        return self.tasks / self.seconds

    @property
    def p50(self) -> float:
        """Median latency of one creation."""
        return statistics.median(self.latencies)


def thread_sessions(forge: Forge) -> Callable[[], requests.Session]:
    """The calling thread's Session with the forge's token (made at its first call), as a
    plain client keeps one per thread."""
    local = threading.local()
    headers = {"Authorization": f"token {forge.token}", "Accept": "application/json"}

    def session() -> requests.Session:
        found: requests.Session | None = getattr(local, "session", None)
        if found is None:
            found = local.session = requests.Session()
            found.headers.update(headers)
        return found

    return session


def raw_loop(forge: Forge, tasks: list[dict[str, Any]], threads: int, repo: str) -> RawRun:
    """Repo + label + one POST per task with `threads` threads, one Session per thread."""
    api = f"{forge.url}/api/v1"
    full = f"{forge.user}/{repo}"
    bodies = [(t["title"], issue_body("raw", TaskSpec.model_validate(t))) for t in tasks]
    latencies: list[float] = []
    session = thread_sessions(forge)

    with Stopwatch() as watch:
        setup = session()
        setup.post(
            f"{api}/user/repos", json={"name": repo, "private": True}, timeout=60
        ).raise_for_status()
        label = setup.post(
            f"{api}/repos/{full}/labels",
            json={"name": "eval-task", "color": LABEL_COLOR},
            timeout=60,
        )
        label.raise_for_status()
        label_id = int(label.json()["id"])

        def create(item: tuple[str, str]) -> int:
            begin = time.perf_counter()
            response = session().post(
                f"{api}/repos/{full}/issues",
                timeout=60,
                json={"title": item[0], "body": item[1], "labels": [label_id]},
            )
            response.raise_for_status()
            latencies.append(time.perf_counter() - begin)
            return int(response.json()["number"])

        with ThreadPoolExecutor(max_workers=threads) as pool:
            numbers = list(pool.map(create, bodies))
    assert len(set(numbers)) == len(tasks)
    return RawRun(threads, len(tasks), watch.seconds, latencies)


def knee(forge: Forge, tasks: list[dict[str, Any]], counts: list[int]) -> list[RawRun]:
    """One raw loop per thread count on `forge`, each in a new repo."""
    return [raw_loop(forge, tasks, n, f"knee-{n}-{time.monotonic_ns()}") for n in counts]


def best(runs: list[RawRun]) -> RawRun:
    """The run with the best throughput: the forge's knee."""
    return max(runs, key=lambda run: run.rate)


def sweep_note(runs: list[RawRun]) -> str:
    """`threads: rate/s (p50 ms)` for each run of a sweep."""
    return ", ".join(f"{r.threads}: {r.rate:.0f}/s ({r.p50 * 1000:.0f} ms)" for r in runs)
