"""A simulated agent lane working on open `eval-task` issues, in one of two modes.

`labels` (default, today's lane): once an issue is `delay` seconds old, a verdict comment
and an `eval-pass`/`eval-fail` label, then close. `pulls`: like the real lane controller,
see `lane_pulls`. Holds (`gate`) keep chosen repos/issues untouched until released.
"""

from __future__ import annotations

import threading
from typing import Any

from .lane_config import LaneConfig, LaneGate
from .lane_pulls import FAIL_MARKER, TASK_LABEL, PullsLane, verdict_comment
from .models import Issue
from .state import ForgeState

__all__ = ["FAIL_MARKER", "TASK_LABEL", "SimulatedLane", "verdict_comment"]


class SimulatedLane:
    """Background thread applying `config` every `config.interval` seconds."""

    def __init__(
        self,
        state: ForgeState,
        delay: float = 5.0,
        interval: float = 0.1,
        *,
        config: LaneConfig | None = None,
        hold_all: bool = False,
    ) -> None:
        self.state = state
        self.config = config or LaneConfig(delay=delay, interval=interval)
        self.gate = LaneGate(hold_all=hold_all)
        self._pulls = PullsLane(state, self.gate)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def delay(self) -> float:
        """Seconds an issue waits before the lane picks it up."""
        return self.config.delay

    def configure(self, **changes: Any) -> LaneConfig:
        """Change settings while running (ValueError on unknown keys or bad values)."""
        self.config = self.config.with_changes(changes)
        return self.config

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
        while not self._stop.wait(self.config.interval):
            self.run_once()

    def run_once(self, now: float | None = None) -> int:
        """Do what is due at `now` (default: the current time); returns actions taken
        (`labels` mode: issues closed; `pulls` mode: pick-ups, merges/abandons, late verdicts).
        Plans of the `pulls` mode keep advancing after a switch back to `labels`."""
        config, when = self.config, self.state.now() if now is None else now
        with self.state.lock:
            actions = self._pulls.step(config, when, pick_up=config.mode == "pulls")
            if config.mode == "labels":
                actions += self._close_due(config, when)
            return actions

    def _close_due(self, config: LaneConfig, now: float) -> int:
        due = self._due(config, now)
        for issue in due:
            passed = FAIL_MARKER not in issue.body
            self.state.finish(
                issue,
                comment=verdict_comment(issue.title, passed),
                labels=["eval-pass" if passed else "eval-fail"],
            )
        return len(due)

    def _due(self, config: LaneConfig, now: float) -> list[Issue]:
        return [
            issue
            for issue in list(self.state.open_issues.values())
            if not issue.is_pull
            and now - issue.created >= config.delay
            and not self.gate.is_held(issue.repo.owner.login, issue.repo.name, issue.number)
            and any(label.name == TASK_LABEL for label in issue.labels.values())
        ]
