"""The service's retention prune (ops/retention.py): once soon after the start, then once
a day, on a thread of its own (a prune reads the whole history: no other worker waits
for it). Only when `SAAS_EVAL_RETENTION_DAYS` is set."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..ops.retention import Retention
from ..util.alarm import Alarm
from .guard import Report, guarded

if TYPE_CHECKING:
    from ..billing.accounts import Billing
    from ..config import Settings
    from ..store import Store

DAY_SECONDS = 86_400.0
FIRST_SECONDS = 60.0  # after the start: the state check and the first cycles go first


def service_retention(store: Store, billing: Billing, settings: Settings) -> Retention:
    """The service's prune, in the audit log as the service's own action."""

    def audit(action: str, target: str, result: str, detail: dict[str, Any]) -> None:
        store.record_action(action, target, actor="service", via="service", result=result, **detail)

    return Retention(store, billing, settings, audit=audit)


class PruneSchedule:
    """Runs `prune()` every `every` seconds, the first `first` seconds from `start`, until
    `stop` is set."""

    def __init__(
        self,
        prune: Callable[[], object],
        alarm: Alarm,
        stop: threading.Event,
        report: Report,
        *,
        first: float = FIRST_SECONDS,
        every: float = DAY_SECONDS,
    ) -> None:
        self.prune = prune
        self.alarm = alarm
        self.stop = stop
        self.report = report
        self.first = first
        self.every = every
        self.runs = 0

    def start(self) -> None:
        """Schedule the first prune."""
        self.alarm.after(self.first, self._due)

    def _due(self) -> None:
        if not self.stop.is_set():
            threading.Thread(target=self._run, name="retention", daemon=True).start()

    def _run(self) -> None:
        guarded("retention", self.report, self.prune)
        self.runs += 1
        if not self.stop.is_set():
            self.alarm.after(self.every, self._due)
