"""Supervisor: the one owner of the workers' threads.

A worker's loop that raises anything is logged once with its traceback and started again
after a backoff: 1 s, doubling to 60 s, back to 1 s once it stayed up for a minute. A
worker that cannot stay up (a sixth failure within five minutes, after five restarts)
stops the service with `failed` set, and `run` exits non-zero so that systemd's
`Restart=on-failure` starts the whole process again (deploy/dropbox-eval.service).

Each worker's state is what `status`, `/readyz`, `/metrics` and `check` show: `running`,
`waiting` (up, but waiting for something outside: the inbox folder is missing), `restarting`
(its loop failed; in its backoff), `failed` (gave up, the service stops) or `stopped`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..util import timestamps

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger("dropbox_eval")
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 60.0
RESTART_LIMIT = 5  # restarts within RESTART_WINDOW_SECONDS; the next failure stops the service
RESTART_WINDOW_SECONDS = 300.0
# a test hook, like crashpoints.py: `inbox-worker:2` makes that worker's first two starts
# raise; `forge-worker:always`, every start. Only the tests' service processes set it.
FAULT_ENV = "DROPBOX_EVAL_WORKER_FAULT"


class Worker(Protocol):
    """What the supervisor runs: a loop until the stop event, and its resources' end."""

    def run(self) -> None:
        """Loop until the service stops; returning earlier counts as a failure."""

    def close(self) -> None:
        """Release what outlives one run of the loop (thread pools), once, at the end."""

    def waiting(self) -> str | None:
        """What the running loop waits for outside the service, or None."""


class InjectedFault(RuntimeError):
    """Raised by the test hook FAULT_ENV."""


@dataclass
class WorkerState:
    """One worker's state as shown to operators."""

    state: str = "starting"
    restarts: int = 0
    last_error: str | None = None
    detail: str | None = None
    since: str = field(default_factory=lambda: timestamps.now())

    def as_dict(self) -> dict[str, Any]:
        """The JSON form in the status file (`workers` of service.json)."""
        return asdict(self)


class Supervisor:
    """Starts each worker on its own thread and keeps it up; thread-safe."""

    def __init__(self, stop: threading.Event, workers: Mapping[str, Worker] | None = None) -> None:
        """`stop` ends every worker (and is set when one gives up); `workers`: each worker
        by the name its state is shown under."""
        self.stop = stop
        self.failed: str | None = None  # why the service must exit non-zero
        self._workers: dict[str, Worker] = {}
        self._states: dict[str, WorkerState] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._faults = _armed_faults()
        for name, worker in (workers or {}).items():
            self.add(name, worker)

    def add(self, name: str, worker: Worker) -> None:
        """Register a worker under its thread name (before `start`)."""
        self._workers[name] = worker
        self._states[name] = WorkerState()

    def start(self) -> None:
        """One thread per worker, each running its worker until the stop event. Each is
        `running` from here: the status written next must not say `starting` until a
        later write (a state folder that turned read-only meanwhile keeps that one)."""
        for name in self._workers:
            self._update(name, state="running")
            thread = threading.Thread(target=self._keep, args=(name,), name=name)
            self._threads.append(thread)
            thread.start()

    def join(self) -> None:
        """Wait for every worker's thread to end, then close the workers."""
        for thread in self._threads:
            thread.join()
        for worker in self._workers.values():
            worker.close()

    def states(self) -> dict[str, dict[str, Any]]:
        """Each worker's state now; a running worker that waits on something outside (its
        `waiting()`) shows as `waiting`, with what it waits for as `detail`."""
        details = {name: worker.waiting() for name, worker in self._workers.items()}
        with self._lock:
            for name, state in self._states.items():
                if state.state in ("running", "waiting"):
                    wanted = "running" if details[name] is None else "waiting"
                    if wanted != state.state:
                        state.since = timestamps.now()
                    state.state, state.detail = wanted, details[name]
            return {name: state.as_dict() for name, state in self._states.items()}

    def _keep(self, name: str) -> None:
        worker = self._workers[name]
        delay = BACKOFF_FIRST_SECONDS
        failures: deque[float] = deque()
        while not self.stop.is_set():
            started = time.monotonic()
            self._update(name, state="running", detail=None)
            try:
                self._inject(name)
                worker.run()
                if self.stop.is_set():
                    break
                raise RuntimeError("its loop returned while the service runs")
            except Exception as exc:  # noqa: BLE001 - a worker's failure must not end the service
                log.exception("worker %s failed", name)  # a repeat within a minute: counted
                cause = f"{type(exc).__name__}: {exc}"
                error = f"{timestamps.now()} {cause}"
            now = time.monotonic()
            if now - started >= BACKOFF_CAP_SECONDS:  # it stayed up: a new failure, not a loop
                delay = BACKOFF_FIRST_SECONDS
            failures.append(now)
            while failures and now - failures[0] > RESTART_WINDOW_SECONDS:
                failures.popleft()
            if len(failures) > RESTART_LIMIT:
                self._give_up(name, error, len(failures))
                return
            self._update(name, state="restarting", last_error=error, detail=None)
            # each failure in a line of its own: the delay differs from the last one's
            log.error("worker %s: restarting in %.0f s after %s", name, delay, cause)
            if self.stop.wait(delay):
                break
            with self._lock:
                self._states[name].restarts += 1
            delay = min(BACKOFF_CAP_SECONDS, delay * 2)
        self._update(name, state="stopped", detail=None)

    def _give_up(self, name: str, error: str, failures: int) -> None:
        minutes = RESTART_WINDOW_SECONDS / 60
        self.failed = (
            f"worker {name} failed {failures} times within {minutes:.0f} minutes "
            f"(last: {error}); stopping the service"
        )
        log.critical("%s", self.failed)
        self._update(name, state="failed", last_error=error)
        self.stop.set()

    def _update(self, name: str, **fields: Any) -> None:
        with self._lock:
            state = self._states[name]
            if "state" in fields and fields["state"] != state.state:
                state.since = timestamps.now()
            for key, value in fields.items():
                setattr(state, key, value)

    def _inject(self, name: str) -> None:
        with self._lock:
            left = self._faults.get(name, 0)
            if left:
                self._faults[name] = left - 1
        if left:
            raise InjectedFault(f"injected fault ({FAULT_ENV})")


def _armed_faults() -> dict[str, int]:
    """`name:count` or `name:always`, comma-separated, from FAULT_ENV."""
    faults = {}
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        name, _, count = item.partition(":")
        if count == "always":
            faults[name] = 1 << 62
        elif count.isdigit():
            faults[name] = int(count)
    return faults
