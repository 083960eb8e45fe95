"""A simulated agent lane: closes due `eval-task` issues with a verdict comment and label."""

from __future__ import annotations

import threading
import time

from .models import Issue
from .state import ForgeState

TASK_LABEL = "eval-task"
FAIL_MARKER = "lane:fail"


def verdict_comment(title: str, passed: bool) -> str:
    """The final comment the lane posts for an issue."""
    word, verdict = ("PASS", "pass") if passed else ("FAIL", "fail")
    return (
        f'Lane verdict: {word} for "{title}".\n\n'
        f'```json\n{{"checks": 3, "verdict": "{verdict}"}}\n```'
    )


class SimulatedLane:
    """Closes each open issue labelled `eval-task` once it is `delay` seconds old."""

    def __init__(self, state: ForgeState, delay: float, interval: float = 0.1) -> None:
        self.state = state
        self.delay = delay
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the background thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="sandbox-lane", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()

    def run_once(self) -> int:
        """Close every due issue now; returns how many were closed."""
        with self.state.lock:
            due = self._due(time.time())
            for issue in due:
                passed = FAIL_MARKER not in issue.body
                self.state.finish(
                    issue,
                    comment=verdict_comment(issue.title, passed),
                    labels=["eval-pass" if passed else "eval-fail"],
                )
            return len(due)

    def _due(self, now: float) -> list[Issue]:
        return [
            issue for issue in self.state.open_issues.values()
            if now - issue.created >= self.delay
            and any(label.name == TASK_LABEL for label in issue.labels.values())
        ]
