"""What the service's parts are given before its workers exist (the composition root
builds it first, then every part with these hooks)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ..util.alarm import Alarm
from .opening import OpenWorker
from .status import StatusFile
from .wakes import Wakes


class Running:
    """What the service's parts are given before the workers exist: the events that wake
    them, the alarm, the status file, the stop event, and (once the stages it drives are
    built) the opener."""

    def __init__(self, status_path: Path) -> None:
        self.stop = threading.Event()
        self.status = StatusFile(status_path)
        self.alarm = Alarm("alarm")
        self.wakes = Wakes()
        self.opener: OpenWorker | None = None

    def retry_later(self, seconds: float, call: Callable[[], None]) -> None:
        """`call()` in `seconds`, unless the service is stopping by then."""

        def unless_stopping() -> None:
            if not self.stop.is_set():
                call()

        self.alarm.after(seconds, unless_stopping)

    def settle_alarm(self, repo: str, seconds: float) -> None:
        """Visit `repo` when its first settling result is due."""
        self.alarm.after(seconds, lambda: self.wakes.nudges.add(repo))
