"""Report delivery: a file in the outbox, or a signed POST to the batch's callback URL.

This module is the boundary for delivery errors: whatever `requests` raises becomes a
DeliveryError. A report whose callback keeps failing is kept in `outbox/undelivered/`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from standardwebhooks import Webhook
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from .callbacks import CallbackPolicy
from .errors import BatchRejected, DeliveryError
from .fileio import write_atomically
from .models import utcnow

CALLBACK_ATTEMPTS = 3


class _RetryableDelivery(DeliveryError):
    """5xx, 429 or a network error: worth another attempt."""


def report_bytes(report: dict[str, Any]) -> str:
    """The canonical serialisation: the same report always gives the same payload."""
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


class FileEmitter:
    """Writes `outbox/<batch_id>.json` atomically."""

    def __init__(self, outbox: Path) -> None:
        self.outbox = outbox

    def write(self, report: dict[str, Any], folder: Path | None = None) -> Path:
        """Write the report into `folder` (default the outbox) and return its path."""
        path = (folder or self.outbox) / f"{report['batch_id']}.json"
        write_atomically(path, report_bytes(report))
        return path


class WebhookEmitter:
    """POSTs reports with Standard Webhooks headers; 3 attempts with exponential backoff."""

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        attempts: int = CALLBACK_ATTEMPTS,
        backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        session: requests.Session | None = None,
    ) -> None:
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep
        self.session = session or requests.Session()

    def post(self, url: str, payload: str, webhook_id: str, secret: str | None = None) -> int:
        """Deliver `payload`; return the receiver's status or raise DeliveryError."""
        retrying = Retrying(
            retry=retry_if_exception_type(_RetryableDelivery),
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.backoff, max=30),
            sleep=self.sleep,
            reraise=True,
        )
        try:
            status: int = retrying(self._post_once, url, payload, webhook_id, secret)
        except _RetryableDelivery as exc:
            raise DeliveryError(f"{exc} (after {self.attempts} attempts)") from exc
        return status

    def _post_once(self, url: str, payload: str, webhook_id: str, secret: str | None) -> int:
        now = utcnow()
        headers = {
            "content-type": "application/json",
            "user-agent": "dropbox-eval",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(now.timestamp())),
        }
        if secret:
            try:
                headers["webhook-signature"] = Webhook(secret).sign(webhook_id, now, payload)
            except Exception as exc:  # the library raises several types for a bad secret
                raise DeliveryError(f"cannot sign with the webhook secret ({exc}); fix it "
                                    "with `dropbox-eval clients rotate-secret`") from exc
        try:
            response = self.session.post(url, data=payload.encode(), headers=headers,
                                         timeout=self.timeout, allow_redirects=False)
        except requests.RequestException as exc:
            raise _RetryableDelivery(f"callback {url} unreachable: {exc}") from exc
        status = response.status_code
        if status == 429 or status >= 500:
            raise _RetryableDelivery(f"callback {url} answered {status}")
        if status >= 300:
            raise DeliveryError(f"callback {url} answered {status}; not retried")
        return status


class Emitter:
    """Chooses file drop or callback for a report; keeps undelivered reports on disk."""

    def __init__(self, files: FileEmitter, webhooks: WebhookEmitter,
                 policy: CallbackPolicy | None = None) -> None:
        self.files = files
        self.webhooks = webhooks
        self.policy = policy or CallbackPolicy()

    @property
    def undelivered_dir(self) -> Path:
        """Where reports whose callback failed are kept."""
        return self.files.outbox / "undelivered"

    def deliver(self, report: dict[str, Any], callback_url: str | None,
                secret: str | None = None) -> str:
        """Deliver the report; return a description of where it went."""
        if not callback_url:
            return str(self.files.write(report))
        webhook_id = f"msg_{report['batch_id']}"
        try:
            self._check(callback_url)
            status = self.webhooks.post(callback_url, report_bytes(report), webhook_id, secret)
        except DeliveryError:
            self.files.write(report, self.undelivered_dir)
            raise
        (self.undelivered_dir / f"{report['batch_id']}.json").unlink(missing_ok=True)
        return f"{callback_url} (HTTP {status})"

    def _check(self, url: str) -> None:
        """Re-check at delivery time: the name may resolve elsewhere than at intake."""
        try:
            self.policy.check(url)
        except BatchRejected as exc:
            raise DeliveryError(exc.message) from exc
