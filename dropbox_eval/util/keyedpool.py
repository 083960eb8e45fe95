"""KeyedPool: the workers' one thread pool. A job runs at most once at a time per key
(single flight: a file, a repo, a batch, a callback host), and at most `per_group` jobs of
one group (a client) run at once, the rest waiting in their group's line, so one client's
backlog holds a bounded share of the threads."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass, field
from typing import Any

Job = Callable[..., Any]


@dataclass
class _Queued:
    keys: frozenset[str]
    group: str
    job: Job
    args: tuple[Any, ...]
    future: Future[Any] = field(default_factory=Future)


class KeyedPool:
    """A thread pool with single-flight keys and per-group shares; thread-safe."""

    def __init__(self, workers: int, name: str, *, per_group: int | None = None) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._per_group = per_group
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._running: dict[str, int] = {}
        self._lines: dict[str, deque[_Queued]] = {}
        self._closed = False

    def busy(self, key: str) -> bool:
        """Whether a job holding `key` is running or waiting."""
        with self._lock:
            return key in self._busy

    def submit(
        self, keys: Iterable[str], job: Job, *args: Any, group: str = ""
    ) -> Future[Any] | None:
        """Run `job(*args)` unless one of `keys` is busy (None then); it may wait for its
        group's share. The job keeps the caller's context variables."""
        queued = _Queued(frozenset(keys), group, job, args)
        with self._lock:
            if self._closed or queued.keys & self._busy:
                return None
            self._busy |= queued.keys
            if self._per_group is not None and self._running.get(group, 0) >= self._per_group:
                self._lines.setdefault(group, deque()).append(queued)
                return queued.future
            self._start(queued)
        return queued.future

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking jobs and drop the ones waiting for their group's share (their
        futures are cancelled: a later visit offers them again); with `wait`, let the
        running ones end."""
        with self._lock:
            self._closed = True
            waiting = [queued for line in self._lines.values() for queued in line]
            self._lines.clear()
            for queued in waiting:
                self._busy -= queued.keys
        for queued in waiting:
            queued.future.cancel()
        self._executor.shutdown(wait=wait)

    def _start(self, queued: _Queued) -> None:
        """Hand a job to a thread; the caller holds the lock."""
        self._running[queued.group] = self._running.get(queued.group, 0) + 1
        context = copy_context()
        self._executor.submit(context.run, self._run, queued)

    def _run(self, queued: _Queued) -> None:
        """Run the job; its keys are free again before anyone waiting on it hears."""
        try:
            result = queued.job(*queued.args)
        except BaseException as error:  # handed to whoever waits on the future
            self._finish(queued)
            queued.future.set_exception(error)
        else:
            self._finish(queued)
            queued.future.set_result(result)

    def _finish(self, queued: _Queued) -> None:
        with self._lock:
            self._busy -= queued.keys
            self._running[queued.group] -= 1
            line = self._lines.get(queued.group)
            if line and not self._closed:
                self._start(line.popleft())
