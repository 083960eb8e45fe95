"""Delivery: emit a finished batch's report (outbox file or signed callback) and keep the
durable schedule of failed deliveries (`delivery_attempts`, `next_delivery_at`,
`last_delivery_error`): one try per visit, the stored schedule decides the next."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from . import crashpoints
from .config import Settings
from .emitter import Emitter
from .errors import DeliveryError, NotFinished
from .models import BatchRecord, BatchStatus, utcnow
from .redact import shown_url
from .report import build_report
from .schedule import backoff
from .store import Store

log = logging.getLogger("dropbox_eval")
MAX_DELIVERY_DELAY = 6 * 3600.0


class Delivery:
    """Emits reports once their batch has ended."""

    def __init__(self, store: Store, emitter: Emitter, settings: Settings) -> None:
        self.store = store
        self.emitter = emitter
        self.settings = settings

    def emit(self, batch_id: str, *, force: bool = False) -> dict[str, Any]:
        """Deliver the report once every task finished; marks the batch `emitted`.

        Emitting an emitted batch does nothing unless `force`, which re-sends the identical
        payload. Raises NotFinished for a running batch, and DeliveryError when the callback
        fails (the report is then kept in `outbox/undelivered/` and a retry scheduled).
        """
        batch = self.store.get_batch(batch_id)
        if batch.status == BatchStatus.RUNNING:
            raise NotFinished(
                f"batch {batch_id}: {batch.done}/{batch.total} tasks finished",
                done=batch.done,
                total=batch.total,
            )
        if batch.emitted_at is not None and not force:
            return {
                "ok": True,
                "batch_id": batch_id,
                "already_emitted": True,
                "emitted_at": batch.emitted_at.isoformat(),
            }
        with crashpoints.operation("emit"):
            return self._emit(batch)

    def _emit(self, batch: BatchRecord) -> dict[str, Any]:
        """The report first (a file, or a POST whose failure keeps a copy in
        `undelivered/`), then `emitted_at` on the record, then the archive: a kill before
        the record write sends the identical report again, with the same webhook-id."""
        batch_id = batch.batch_id
        report = batch.report or build_report(batch, self.store.get_tasks(batch_id))
        try:
            where = self.emitter.deliver(report, batch.callback_url, self._secret(batch))
        except DeliveryError as exc:
            with crashpoints.operation("delivery-schedule"):
                self._failed(batch, exc)
            raise
        # completed -> emitted; the side exits keep their status, with emitted_at
        status = BatchStatus.EMITTED if batch.status == BatchStatus.COMPLETED else batch.status
        self.store.update_batch(
            batch_id,
            emitted_at=utcnow(),
            status=status,
            last_delivery_error=None,
            next_delivery_at=None,
        )
        log.info("batch %s: report emitted to %s", batch_id, where)
        return {"ok": True, "batch_id": batch_id, "delivered_to": where}

    def is_due(self, batch: BatchRecord) -> bool:
        """A finished, unemitted batch whose delivery is not waiting out a backoff or given
        up."""
        if batch.status == BatchStatus.RUNNING or batch.emitted_at:
            return False
        if batch.delivery_attempts == 0:
            return True
        return batch.next_delivery_at is not None and batch.next_delivery_at <= utcnow()

    def _secret(self, batch: BatchRecord) -> str | None:
        client = self.store.get_client(batch.client_id)
        return (client.webhook_secret if client else None) or self.settings.webhook_secret

    def _failed(self, batch: BatchRecord, error: DeliveryError) -> None:
        attempts = batch.delivery_attempts + 1
        limit = self.settings.delivery_max_attempts
        delay = backoff(attempts, self.settings.delivery_retry_base, MAX_DELIVERY_DELAY)
        next_at = utcnow() + delay if attempts < limit else None
        self.store.update_batch(
            batch.batch_id,
            delivery_attempts=attempts,
            last_delivery_error=str(error),
            next_delivery_at=next_at,
        )
        if next_at is None:
            log.error(
                "batch %s: delivery failed %d times, giving up; the report is in "
                "outbox/undelivered/ (re-send with `dropbox-eval emit %s --force`)",
                batch.batch_id,
                attempts,
                batch.batch_id,
            )
        else:
            log.warning(
                "batch %s: delivery failed (%d/%d), next try at %s: %s",
                batch.batch_id,
                attempts,
                limit,
                next_at.isoformat(),
                error,
            )


def destination(batch: BatchRecord) -> str:
    """What a delivery waits on: the callback's host, or the outbox (never slow)."""
    if not batch.callback_url:
        return "outbox"
    try:
        return urlsplit(batch.callback_url).netloc.rpartition("@")[2].lower()
    except ValueError:
        return shown_url(batch.callback_url)
