"""The one scheduler of forge work: every forge exchange waits here for a slot of the
in-flight budget (limiter.py), and waiting exchanges are served client by client in turn
(weighted round robin, util/roundrobin.py), so one client's backlog never stands in front
of another client's first request.

The caller names the client it works for with `on_behalf_of` (a context variable: a
thread started with `contextvars.copy_context()` keeps it); work for nobody in particular
(the cross-repo search, `/version`) is the service's own. The exchange runs in the
caller's thread once granted: the scheduler holds no thread of its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

from ..util.roundrobin import RoundRobin
from .limiter import Limiter, Outcome

SERVICE = "-"  # the queue of work done for no client in particular
P = ParamSpec("P")
T = TypeVar("T")
Classify = Callable[[BaseException], Outcome]
_client: ContextVar[str] = ContextVar("forge_client", default=SERVICE)


@contextlib.contextmanager
def on_behalf_of(client_id: str) -> Iterator[None]:
    """Forge calls made inside the block queue as `client_id`'s."""
    token = _client.set(client_id)
    try:
        yield
    finally:
        _client.reset(token)


def current_client() -> str:
    """The client the current forge work is for."""
    return _client.get()


class ForgeScheduler:
    """A fair gate in front of the forge; thread-safe."""

    def __init__(
        self,
        limiter: Limiter,
        classify: Classify | None = None,
        weight_of: Callable[[str], int] | None = None,
    ) -> None:
        """`classify` turns a call's exception into what the limiter learns from it (by
        default: not an overload); `weight_of` gives a client's turns per round (1)."""
        self.limiter = limiter
        self._classify = classify or (lambda _error: Outcome(0.0))
        self._lock = threading.Lock()
        self._waiters: RoundRobin[threading.Event] = RoundRobin(weight_of)
        self._in_flight = 0
        self._timer: threading.Timer | None = None

    @property
    def in_flight(self) -> int:
        """Calls running now."""
        return self._in_flight

    def waiting(self) -> dict[str, int]:
        """Calls waiting for a slot, per client."""
        with self._lock:
            return self._waiters.counts()

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` in this thread once the current client's turn gives it a slot."""
        self._acquire(current_client())
        started = time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            outcome = self._classify(error)
            self._release(Outcome(time.monotonic() - started, *_rest(outcome)))
            raise
        self._release(Outcome(time.monotonic() - started))
        return result

    def _acquire(self, key: str) -> None:
        with self._lock:
            if not self._waiters and self._has_room():
                self._in_flight += 1
                return
            waiter = threading.Event()
            self._waiters.push(key, waiter)
            self._dispatch()
        waiter.wait()

    def _release(self, outcome: Outcome) -> None:
        with self._lock:
            in_flight = self._in_flight
            self._in_flight -= 1
        self.limiter.record(outcome, in_flight)
        with self._lock:
            self._dispatch()

    def _has_room(self) -> bool:
        return self._in_flight < self.limiter.limit and self.limiter.paused_for() == 0

    def _dispatch(self) -> None:
        """Grant slots to waiting calls, client by client; the caller holds the lock."""
        while self._waiters and self._has_room():
            _key, waiter = self._waiters.pop()
            self._in_flight += 1
            waiter.set()
        pause = self.limiter.paused_for()
        if self._waiters and pause > 0 and self._timer is None:
            self._timer = threading.Timer(pause, self._resume)
            self._timer.daemon = True
            self._timer.start()

    def _resume(self) -> None:
        with self._lock:
            self._timer = None
            self._dispatch()


def _rest(outcome: Outcome) -> tuple[bool, float | None]:
    return outcome.overloaded, outcome.retry_after
