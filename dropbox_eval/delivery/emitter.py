"""Report delivery: a file in the outbox, or a signed POST to the batch's callback URL
(webhook.py, the boundary for the POST's errors). A report whose callback keeps failing
is kept in `outbox/undelivered/`.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import BatchRejected, DeliveryError
from ..protocol.batchlines import lines_bytes, report_lines
from ..protocol.callbacks import CallbackPolicy, CallbackTarget
from ..protocol.report import in_client_order, report_batch_id
from ..util.canonicaljson import canonical
from ..util.fileio import SHARED_MODE, read_blocks, write_atomically
from ..util.names import UNDELIVERED_DIR
from ..util.redact import shown_url
from .webhook import WebhookEmitter

log = logging.getLogger("dropbox_eval")


BLOCK = 1 << 20  # bytes of a fixed report copied at a time


@dataclass(frozen=True)
class FixedReport:
    """A batch's fixed report where the store keeps it (`Store.open_report`): copied to the
    outbox a block at a time, read whole only for a callback's body or a JSON Lines twin."""

    batch_id: str
    handle: BinaryIO

    def blocks(self) -> Iterator[bytes]:
        """Its bytes, a block at a time."""
        self.handle.seek(0)
        yield from read_blocks(self.handle, BLOCK)

    def whole(self) -> bytes:
        """Its bytes."""
        self.handle.seek(0)
        return self.handle.read()

    def size(self) -> int:
        """How many bytes it has."""
        return self.handle.seek(0, io.SEEK_END)

    def drain(self) -> Iterator[bytes]:
        """Its blocks, then the handle closed (for a response streamed after its
        handler returned)."""
        with self.handle:
            yield from self.blocks()


Document = dict[str, Any] | bytes | FixedReport
"""A report, its canonical bytes (protocol/report.py), or where they are kept."""


def report_bytes(report: Document) -> bytes:
    """The canonical serialisation: the same report always gives the same payload."""
    if isinstance(report, FixedReport):
        return report.whole()
    return report if isinstance(report, bytes) else canonical(report)


def _batch_id(report: Document) -> str:
    if isinstance(report, FixedReport):
        return report.batch_id
    return report_batch_id(report) if isinstance(report, bytes) else str(report["batch_id"])


def _parsed(report: Document) -> dict[str, Any]:
    return report if isinstance(report, dict) else in_client_order(report_bytes(report))


class FileEmitter:
    """Writes `outbox/<batch_id>.json` atomically (and `<batch_id>.jsonl` before it, for a
    batch that came as JSON Lines)."""

    def __init__(self, outbox: Path) -> None:
        self.outbox = outbox

    def write(self, report: Document, folder: Path | None = None, *, lines: bool = False) -> Path:
        """Write the report into `folder` (default the outbox) and return its path; with
        `lines`, its JSON Lines form first (the `.json` last: its presence says both are)."""
        path = (folder or self.outbox) / f"{_batch_id(report)}.json"
        if lines:
            write_atomically(
                path.with_suffix(".jsonl"),
                lines_bytes(report_lines(_parsed(report))),
                mode=SHARED_MODE,
            )
        content = report.blocks() if isinstance(report, FixedReport) else report_bytes(report)
        write_atomically(path, content, mode=SHARED_MODE)
        return path


class Emitter:
    """Chooses file drop or callback for a report; keeps undelivered reports on disk."""

    def __init__(
        self,
        files: FileEmitter,
        webhooks: WebhookEmitter,
        policy: CallbackPolicy | None = None,
        on_attempt: Callable[[str], None] | None = None,
    ) -> None:
        """`on_attempt` is told the outcome of every delivery: `delivered` or `failed`."""
        self.files = files
        self.webhooks = webhooks
        self.policy = policy or CallbackPolicy()
        self.on_attempt = on_attempt

    @property
    def undelivered_dir(self) -> Path:
        """Where reports whose callback failed are kept."""
        return self.files.outbox / UNDELIVERED_DIR

    def deliver(
        self,
        report: Document,
        callback_url: str | None,
        secret: str | None = None,
        *,
        lines: bool = False,
    ) -> str:
        """Deliver the report; return a description of where it went. `lines`: the batch
        came as JSON Lines, so its outbox file has a JSON Lines twin."""
        try:
            where = self._deliver(report, callback_url, secret, lines)
        except DeliveryError:
            self._attempted("failed")
            raise
        self._attempted("delivered")
        return where

    def _deliver(
        self, report: Document, callback_url: str | None, secret: str | None, lines: bool
    ) -> str:
        if not callback_url:
            return str(self.files.write(report, lines=lines))
        batch_id = _batch_id(report)
        webhook_id = f"msg_{batch_id}"
        try:
            target = self._check(callback_url)
            payload = report_bytes(report).decode("ascii")
            status = self.webhooks.post(target, payload, webhook_id, secret)
        except DeliveryError as exc:
            self._keep_undelivered(report, exc)
            raise
        # the copy kept by an earlier failed try is stale now; one that cannot go (a
        # read-only outbox) must not make a delivered report look undelivered
        with contextlib.suppress(OSError):
            (self.undelivered_dir / f"{batch_id}.json").unlink(missing_ok=True)
        return f"{shown_url(callback_url)} (HTTP {status})"

    def _keep_undelivered(self, report: Document, failure: DeliveryError) -> None:
        """Keep the report in `outbox/undelivered/`; a full or read-only outbox does not
        hide the delivery's own failure (the attempt still counts toward giving up)."""
        try:
            self.files.write(report, self.undelivered_dir)
        except OSError as exc:
            log.warning(
                "batch %s: %s; its copy in %s could not be kept: %s",
                _batch_id(report),
                failure,
                self.undelivered_dir,
                exc,
            )

    def _attempted(self, outcome: str) -> None:
        if self.on_attempt is not None:
            self.on_attempt(outcome)

    def _check(self, url: str) -> CallbackTarget:
        """Re-check at delivery time: the name may resolve elsewhere than at intake."""
        try:
            return self.policy.check(url)
        except BatchRejected as exc:
            raise DeliveryError(exc.message) from exc
