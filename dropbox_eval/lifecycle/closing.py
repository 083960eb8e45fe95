"""Closing a batch: once, its final charge (the lane's finished work), the hold released,
the report fixed. ("Settle" is the results' quiet window, results/asof.py.)"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..billing.accounts import Billing
from ..models import BatchRecord, BatchStatus, TaskRecord, utcnow
from ..protocol.report import ReportPieces
from ..store import Store
from ..util import crashpoints

log = logging.getLogger("dropbox_eval")


class BatchCloser:
    """Ends running batches; the only place that charges and releases."""

    def __init__(
        self, store: Store, billing: Billing, on_closed: Callable[[str], None] | None = None
    ) -> None:
        """`on_closed` is told of each batch closed (the service delivers it at once)."""
        self.store = store
        self.billing = billing
        self.on_closed = on_closed

    def close(
        self,
        batch_id: str,
        tasks: list[TaskRecord],
        status: BatchStatus,
        *,
        polled_at: datetime | None = None,
        failure: str | None = None,
    ) -> BatchRecord:
        """End a running batch: charge the tasks the lane finished, release the hold, set
        the final status and fix the report. Under the lock and only once: a batch that
        another process closed meanwhile is returned as it is."""
        with self.store.transaction() as tx:  # joins the caller's, if any
            current = tx.get_batch(batch_id)
            if current.status != BatchStatus.RUNNING:
                return current
            finished = sum(1 for t in tasks if t.status.is_lane_verdict)
            charged = finished * current.unit_price
            fields: dict[str, Any] = {
                "status": status,
                "completed_at": utcnow(),
                "charged": charged,
                "done": len(tasks),
                "failure": failure,
                "last_polled_at": polled_at or current.last_polled_at,
                "next_attempt_at": None,
            }
            final = current.model_copy(update=fields)
            # The report fixed first (every later emit sends these bytes), then the record,
            # then the final charge with the index row: a kill between the last two leaves a
            # finished record still holding credits, which the state check at the next
            # start settles from the record (statecheck.py).
            with crashpoints.operation("close"):
                closed = tx.update_batch(
                    batch_id,
                    settlement=self.billing.final_charge(
                        current.client_id, batch_id, current.cost, charged
                    ),
                    **fields,
                    report=ReportPieces(final, tasks),  # written as it is made
                )
            on_closed = self.on_closed
            if on_closed is not None:  # once the close has landed (the caller's commit)
                tx.after_commit(lambda: on_closed(batch_id))
        log.info(
            "batch %s: %s; charged %d, released %d%s",
            batch_id,
            status,
            charged,
            current.cost - charged,
            f" ({failure})" if failure else "",
        )
        return closed
