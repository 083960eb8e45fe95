"""The node's heartbeat: while the service runs, its row in the store says it is alive and
every lease it holds is extended (store/nodes.py), a third of a lease apart, so that one
missed beat never lets another node take this one's work. Each beat also counts the nodes
up, for the forge's budget that they share (Limiter.share)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..errors import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..store.nodes import Node
    from .guard import Report

log = logging.getLogger("dropbox_eval")


class Heartbeat:
    """Beats `node` when a beat is due; the service's main loop ticks it every second."""

    def __init__(
        self,
        node: Node,
        lease_seconds: float,
        report: Report,
        on_nodes: Callable[[int], None] | None = None,
    ) -> None:
        """`on_nodes` is told how many nodes are up (this one included) after each beat."""
        self.node = node
        self.on_nodes = on_nodes
        self.every = lease_seconds / 3
        self.report = report
        self._next = 0.0
        self.failing = False

    def tick(self) -> None:
        """Beat if due; a store that cannot be reached is reported and tried next tick."""
        if time.monotonic() < self._next:
            return
        try:
            self.node.beat()
            if self.on_nodes is not None:
                up = sum(1 for row in self.node.nodes() if row.state == "up")
                self.on_nodes(max(1, up))
        except StoreError as exc:
            if not self.failing:
                log.warning("node %s: heartbeat failed: %s", self.node.node_id, exc)
            self.failing = True
            self.report("heartbeat", exc)
            return
        if self.failing:
            log.info("node %s: heartbeat back", self.node.node_id)
        self.failing = False
        self._next = time.monotonic() + self.every
