"""Delivery: emit a finished batch's report (outbox file or signed callback): one try per
visit; a failure is recorded, and the next try decided, by attempts.py.

A try that storage refuses (a full or read-only disk: nothing can be recorded) waits in
this process (clock.Backoff: 1 s doubling to a minute), never every tick. A report that
went out but whose `emitted_at` could not be written is remembered here: the next tries
only write the record, they never send the report again. A restart in between sends it
once more (at least once, with the same webhook-id), never in a loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from ..config import Settings
from ..errors import DeliveryError, NotFinished, StorageUnavailable, storage_errors
from ..lifecycle.attempts import Attempts
from ..models import BatchRecord, BatchStatus, utcnow
from ..protocol.batchlines import is_lines_name
from ..protocol.report import report_document
from ..store import Store
from ..util import crashpoints
from ..util.clock import Backoff
from ..util.redact import shown_url
from ..util.timestamps import rfc3339
from .emitter import Document, Emitter, FixedReport

log = logging.getLogger("dropbox_eval")


class Delivery:
    """Emits reports once their batch has ended."""

    def __init__(
        self, store: Store, emitter: Emitter, settings: Settings, attempts: Attempts
    ) -> None:
        self.store = store
        self.emitter = emitter
        self.settings = settings
        self.attempts = attempts
        self.storage_waits = Backoff()  # batch id -> its tries that storage refused
        self._unrecorded: dict[str, str] = {}  # batch id -> where its report went, unrecorded

    def deliver_due(self, batch_id: str) -> dict[str, Any]:
        """One automatic try, on the stored schedule (the delivery worker's)."""
        return self.emit(batch_id, manual=False)

    def emit(self, batch_id: str, *, force: bool = False, manual: bool = True) -> dict[str, Any]:
        """Deliver the report once every task finished; marks the batch `emitted`.

        Emitting an emitted batch does nothing unless `force`, which re-sends the identical
        payload. Raises NotFinished for a running batch, and DeliveryError when the callback
        fails (the report is then kept in `outbox/undelivered/`). A `manual` try (an
        operator's or a client's) is an extra one: it leaves the automatic schedule as it is.
        """
        batch = self.store.get_batch(batch_id)
        if batch.status == BatchStatus.RUNNING:
            raise NotFinished(
                f"batch {batch_id}: {batch.done}/{batch.total} tasks finished",
                done=batch.done,
                total=batch.total,
            )
        if batch.emitted_at is not None and not force:
            self._unrecorded.pop(batch_id, None)  # recorded by another process meanwhile
            return {
                "ok": True,
                "batch_id": batch_id,
                "already_emitted": True,
                "emitted_at": rfc3339(batch.emitted_at),
            }
        with crashpoints.operation("emit"):
            try:
                return self._emit(batch, manual, force)
            except StorageUnavailable as exc:
                self._refused(batch_id, exc)
                raise

    def _emit(self, batch: BatchRecord, manual: bool, force: bool) -> dict[str, Any]:
        """The report first (a file, or a POST whose failure keeps a copy in
        `undelivered/`), then `emitted_at` on the record, then the archive: a kill before
        the record write sends the identical report again, with the same webhook-id."""
        batch_id = batch.batch_id
        where = None if force else self._unrecorded.get(batch_id)
        if where is None:  # else it went out already: only the record is left to write
            where = self._send(batch, manual)
            self._unrecorded[batch_id] = where
        # completed -> emitted; the side exits keep their status, with emitted_at
        status = BatchStatus.EMITTED if batch.status == BatchStatus.COMPLETED else batch.status
        self.store.update_batch(
            batch_id,
            emitted_at=utcnow(),
            status=status,
            last_delivery_error=None,
            next_delivery_at=None,
        )
        self._unrecorded.pop(batch_id, None)
        self.storage_waits.succeeded(batch_id)
        log.info("batch %s: report emitted to %s", batch_id, where)
        return {"ok": True, "batch_id": batch_id, "delivered_to": where}

    def _send(self, batch: BatchRecord, manual: bool) -> str:
        """Deliver the report once; where it went. A failure is scheduled (attempts.py)."""
        try:
            # storage errors of the emitter's own files too: waited out, not a tick
            with storage_errors(), self._report(batch) as report:
                return self.emitter.deliver(
                    report,
                    batch.callback_url,
                    self._secret(batch),
                    lines=batch.source is not None and is_lines_name(batch.source),
                )
        except DeliveryError as exc:
            with crashpoints.operation("delivery-schedule"):
                what_next = self.attempts.delivery_failed(batch, exc, manual=manual)
            log.warning("batch %s: delivery %s", batch.batch_id, what_next)
            raise DeliveryError(what_next) from exc

    @contextlib.contextmanager
    def _report(self, batch: BatchRecord) -> Iterator[Document]:
        """`stored_report`, its file closed after the block."""
        report = stored_report(self.store, batch)
        with report.handle if isinstance(report, FixedReport) else contextlib.nullcontext():
            yield report

    def _refused(self, batch_id: str, error: StorageUnavailable) -> None:
        """Storage refused a try: wait before the next one, and say what the error stopped
        (the message the worker logs, the API answers and `emit` prints)."""
        tries, wait = self.storage_waits.failed(batch_id)
        where = self._unrecorded.get(batch_id)
        if where is None:
            stopped = f"report not delivered (try {tries}; again in {wait:.0f} s)"
        else:
            stopped = (
                f"report delivered to {where} but not recorded (try {tries}; recording "
                f"again in {wait:.0f} s, without sending it again)"
            )
        error.message = f"{stopped}: {error.message}"

    def is_due(self, batch: BatchRecord) -> bool:
        """A finished, unemitted batch whose delivery is not waiting out a backoff (stored,
        or this process's after storage refused a try) or given up."""
        if batch.status == BatchStatus.RUNNING or batch.emitted_at:
            return False
        if not self.storage_waits.ready(batch.batch_id):
            return False
        return self.attempts.delivery_due(batch)

    def _secret(self, batch: BatchRecord) -> str | None:
        client = self.store.get_client(batch.client_id)
        return (client.webhook_secret if client else None) or self.settings.webhook_secret


def stored_report(store: Store, batch: BatchRecord) -> bytes | FixedReport:
    """An ended batch's report as delivered: the one fixed at its close, where the store
    keeps it (the caller closes its handle); one made now when none was fixed (a batch
    that ended before reports were)."""
    handle = store.open_report(batch.batch_id)
    if handle is None:
        return report_document(batch, store.get_tasks(batch.batch_id))
    return FixedReport(batch.batch_id, handle)


def destination(batch: BatchRecord) -> str:
    """What a delivery waits on: the callback's host, or the outbox (never slow)."""
    if not batch.callback_url:
        return "outbox"
    try:
        return urlsplit(batch.callback_url).netloc.rpartition("@")[2].lower()
    except ValueError:
        return shown_url(batch.callback_url)
