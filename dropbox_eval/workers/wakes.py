"""Wakes: the events that start a worker's next look at once (a resume, a batch ended)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from ..results.webhooks import Nudges

log = logging.getLogger("dropbox_eval")


@dataclass(frozen=True)
class Wakes:
    """One event per worker loop, made before the parts that set them."""

    inbox: threading.Event = field(default_factory=threading.Event)
    forge: threading.Event = field(default_factory=threading.Event)
    delivery: threading.Event = field(default_factory=threading.Event)
    nudges: Nudges = field(default_factory=Nudges)

    def resumed(self) -> None:
        """Intake resumed: take the waiting files and run a forge cycle now (batches posted
        or retried meanwhile get their issues, stored cancels finish)."""
        log.info("intake resumed: taking the waiting files")
        self.inbox.set()
        self.forge.set()
        self.nudges.wake.set()

    def batch_closed(self, _batch_id: str) -> None:
        """A batch ended: deliver its report now."""
        self.delivery.set()
