"""DeliveryWorker: due reports -> outbox or callback, at once when a batch ends; one
delivery per callback host at a time, so a receiver that never answers holds one thread."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..delivery.deliverer import Delivery, destination
from ..errors import StorageUnavailable
from ..models import BatchRecord, BatchStatus
from ..store.nodes import SoloNode, leased
from ..util.keyedpool import KeyedPool
from .guard import POOL_SIZE, TICK_SECONDS, Report, guarded

if TYPE_CHECKING:
    from concurrent.futures import Future

    from ..store import Store
    from ..store.nodes import Node

log = logging.getLogger("dropbox_eval")


class DeliveryWorker:
    """Due reports -> outbox or callback, one delivery per destination at a time."""

    def __init__(
        self,
        store: Store,
        delivery: Delivery,
        stop: threading.Event,
        report: Report,
        wake: threading.Event | None = None,
        node: Node | None = None,
    ) -> None:
        """`wake` is set when a batch ends: deliver it now. `node`: a report is delivered
        under this node's `deliver` lease (None: the only node)."""
        self.node = node or SoloNode("solo")
        self.store = store
        self.delivery = delivery
        self.stop = stop
        self.report = report
        self.pool = KeyedPool(POOL_SIZE, "delivery")  # keys: the batch, its callback host
        self.wake = wake or threading.Event()

    def run(self) -> None:
        """A pass whenever a batch ends, and every tick for the retries that fall due."""
        while not self.stop.is_set():
            self.wake.clear()
            guarded("delivery", self.report, self.deliver_due)
            self.wake.wait(TICK_SECONDS)

    def waiting(self) -> None:
        """Delivery waits on nothing outside the service (a slow receiver holds one thread)."""

    def close(self) -> None:
        """Let the deliveries under way finish (after the last run)."""
        self.pool.shutdown(wait=True)

    def deliver_due(self) -> list[Future[Any]]:
        """Start the delivery of every due report whose destination is free."""
        started = []
        for row in self.store.list_batches(live_only=True):
            if row.status == BatchStatus.RUNNING or self.stop.is_set():
                continue
            batch = self.store.get_batch(row.batch_id)
            if batch.emitted_at is not None:  # a crash or a full disk came before archiving
                self._archive(batch)
                continue
            if not self.delivery.is_due(batch):
                continue
            host = destination(batch)
            keys = [batch.batch_id] if host == "outbox" else [batch.batch_id, f"host:{host}"]
            future = self.pool.submit(keys, self._deliver, batch.batch_id)  # files never wait
            if future is not None:
                started.append(future)
        return started

    def _archive(self, batch: BatchRecord) -> None:
        """Archive an emitted batch; one that storage refuses waits (the others go on)."""
        waits = self.delivery.storage_waits
        if not waits.ready(batch.batch_id):
            return
        try:
            self.store.archive(batch)
        except StorageUnavailable as exc:
            tries, wait = waits.failed(batch.batch_id)
            log.warning(
                "batch %s: emitted, not archived yet (try %d; again in %.0f s): %s",
                batch.batch_id,
                tries,
                wait,
                exc,
            )
            return
        waits.succeeded(batch.batch_id)

    def _deliver(self, batch_id: str) -> None:
        guarded(f"batch {batch_id}", self.report, self._leased_delivery, batch_id)

    def _leased_delivery(self, batch_id: str) -> None:
        """Deliver unless another node is delivering it (its record then says emitted)."""
        with leased(self.node, "deliver", batch_id) as mine:
            if mine:
                self.delivery.deliver_due(batch_id)
