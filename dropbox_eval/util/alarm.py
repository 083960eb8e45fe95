"""Alarm: call something at an instant, on one thread for every alarm (a settling result
becomes final when its window ends, not at the next poll cycle)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("dropbox_eval")


class Alarm:
    """A heap of due calls and the one thread that makes them; a call that raises is
    dropped (the poll cycle is the backstop)."""

    def __init__(self, name: str = "alarm") -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # equal instants keep their order, never compared
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def after(self, seconds: float, call: Callable[[], None]) -> None:
        """Make `call()` in `seconds` (at once when not positive)."""
        with self._changed:
            entry = (time.monotonic() + max(0.0, seconds), next(self._order), call)
            heapq.heappush(self._due, entry)
            self._changed.notify()

    def pending(self) -> int:
        """Calls not made yet."""
        with self._changed:
            return len(self._due)

    def stop(self) -> None:
        """Drop the pending calls and end the thread."""
        with self._changed:
            self._stopped = True
            self._due.clear()
            self._changed.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    timeout = self._due[0][0] - time.monotonic() if self._due else None
                    self._changed.wait(timeout)
                if self._stopped:
                    return
                _, _, call = heapq.heappop(self._due)
            try:
                call()
            except Exception:  # noqa: BLE001 - one failed call must not stop the others
                log.exception("timed call failed (the next poll cycle is the backstop)")
