"""Report delivery: a file in the outbox, or a signed POST to the batch's callback URL.

This module is the boundary for delivery errors: whatever urllib3 raises becomes a
DeliveryError. A report whose callback keeps failing is kept in `outbox/undelivered/`.

The POST goes to an address the CallbackPolicy checked moments before (the host name is
never resolved again), and the socket's peer is compared with that address once connected.
The Host header and the TLS server name and certificate check keep the URL's host name.
No proxy from the environment is used and redirects are not followed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests.utils
import urllib3
from standardwebhooks import Webhook
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError, NewConnectionError

from ..errors import BatchRejected, DeliveryError
from ..models import utcnow
from ..protocol.batchlines import lines_bytes, report_lines
from ..protocol.callbacks import CallbackPolicy, CallbackTarget
from ..protocol.report import canonical, in_client_order, report_batch_id
from ..util import crashpoints
from ..util.fileio import SHARED_MODE, write_atomically
from ..util.names import UNDELIVERED_DIR
from ..util.neterrors import plain_reason
from ..util.redact import shown_url

log = logging.getLogger("dropbox_eval")


Document = dict[str, Any] | bytes  # a report, or its canonical bytes (protocol/report.py)


def report_bytes(report: Document) -> bytes:
    """The canonical serialisation: the same report always gives the same payload."""
    return report if isinstance(report, bytes) else canonical(report)


def _batch_id(report: Document) -> str:
    return report_batch_id(report) if isinstance(report, bytes) else str(report["batch_id"])


def _parsed(report: Document) -> dict[str, Any]:
    return in_client_order(report) if isinstance(report, bytes) else report


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
        write_atomically(path, report_bytes(report), mode=SHARED_MODE)
        return path


class Deadline:
    """A whole exchange's time limit. urllib3's read timeout bounds each wait for bytes, so
    a receiver that sends its answer a byte a second never meets it and holds the delivery
    (and a stopping service) for as long as it likes; at the deadline the socket is shut
    down, which ends any wait on it at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket | None) -> None:
        """Shut `sock` down at the deadline (at once when it has passed)."""
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if not self.expired:
                return
        _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _too_slow(url: str, deadline: Deadline) -> DeliveryError:
    return DeliveryError(
        f"callback {url} did not answer within {deadline.seconds:.0f} s "
        "(SAAS_EVAL_CALLBACK_TIMEOUT, connecting included)"
    )


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already
        sock.shutdown(socket.SHUT_RDWR)


class _PinnedHTTPConnection(HTTPConnection):
    """Refuses a socket whose peer is not the address the pool was pinned to."""

    deadline: Deadline | None = None

    def connect(self) -> None:
        super().connect()
        _connected(self, self.deadline)


class _PinnedHTTPSConnection(HTTPSConnection):
    """The TLS variant of _PinnedHTTPConnection."""

    deadline: Deadline | None = None

    def connect(self) -> None:
        super().connect()
        _connected(self, self.deadline)


def _connected(connection: HTTPConnection, deadline: Deadline | None) -> None:
    """A new connection: its peer must be the checked address; its socket ends at the
    exchange's deadline."""
    peer = str(connection.sock.getpeername()[0]) if connection.sock else ""
    if ipaddress.ip_address(peer.split("%")[0]) != ipaddress.ip_address(connection.host):
        connection.close()
        raise NewConnectionError(
            connection, f"connected to {peer}, not the checked {connection.host}"
        )
    if deadline is not None:
        deadline.watch(connection.sock)


class _Deadlined:
    """A pool whose connections end at its `deadline` (set before its first request)."""

    deadline: Deadline | None = None

    def _new_conn(self) -> Any:
        connection = super()._new_conn()  # type: ignore[misc]
        connection.deadline = self.deadline
        return connection


class _PinnedHTTPPool(_Deadlined, urllib3.HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(_Deadlined, urllib3.HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class WebhookEmitter:
    """POSTs reports with Standard Webhooks headers: one attempt per call (attempts.py
    decides the next)."""

    def __init__(self, *, timeout: float = 10.0, ca_certs: str | None = None) -> None:
        self.timeout = timeout
        self.ca_certs = ca_certs or requests.utils.DEFAULT_CA_BUNDLE_PATH

    def post(
        self, target: CallbackTarget, payload: str, webhook_id: str, secret: str | None = None
    ) -> int:
        """Deliver `payload` to a checked target once; return the receiver's 2xx status or
        raise DeliveryError saying what the receiver did."""
        url = shown_url(target.url)
        headers = self._headers(target, payload, webhook_id, secret)
        with Deadline(self.total_seconds) as deadline:
            try:
                status = self._send(target, payload.encode(), headers, deadline)
            except HTTPError as exc:
                if deadline.expired:
                    raise _too_slow(url, deadline) from exc
                raise DeliveryError(f"callback {url} unreachable: {plain_reason(exc)}") from exc
        if deadline.expired:  # cut mid-headers, the answer can look complete: it is not
            raise _too_slow(url, deadline)
        if status >= 300:
            raise DeliveryError(f"callback {url} answered {status}")
        return status

    def _headers(
        self, target: CallbackTarget, payload: str, webhook_id: str, secret: str | None
    ) -> dict[str, str]:
        now = utcnow()
        headers = {
            "host": target.host_header,
            "content-type": "application/json",
            "user-agent": "dropbox-eval",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(now.timestamp())),
        }
        if secret:
            try:
                headers["webhook-signature"] = Webhook(secret).sign(webhook_id, now, payload)
            except Exception as exc:  # the library raises several types for a bad secret
                raise DeliveryError(
                    f"cannot sign with the webhook secret ({exc}); fix it "
                    "with `dropbox-eval clients rotate-secret`"
                ) from exc
        return headers

    @property
    def total_seconds(self) -> float:
        """The whole exchange's limit: connecting, then the answer's status line and headers."""
        return min(5.0, self.timeout) + self.timeout

    def _send(
        self, target: CallbackTarget, body: bytes, headers: dict[str, str], deadline: Deadline
    ) -> int:
        """One POST, to each checked address in turn until one accepts the connection."""
        error: HTTPError | None = None
        for address in target.addresses:
            pool = self._pool(target, str(address))
            pool.deadline = deadline
            try:
                response = pool.urlopen(
                    "POST",
                    target.request_uri,
                    body=body,
                    headers=headers,
                    redirect=False,
                    retries=False,
                    assert_same_host=False,
                    preload_content=False,
                )
                status = int(response.status)
                response.release_conn()
                crashpoints.wrote(f"POST {shown_url(target.url)}")
                return status
            except NewConnectionError as exc:  # this address refused: try the next
                error = exc
            finally:
                pool.close()
        if error is None:
            raise DeliveryError(
                f"callback {shown_url(target.url)}: no checked address to connect to"
            )
        raise error

    def _pool(self, target: CallbackTarget, address: str) -> _PinnedHTTPPool | _PinnedHTTPSPool:
        timeout = urllib3.Timeout(connect=min(5.0, self.timeout), read=self.timeout)
        if target.scheme == "http":
            return _PinnedHTTPPool(address, target.port, timeout=timeout, retries=False)
        return _PinnedHTTPSPool(
            address,
            target.port,
            timeout=timeout,
            retries=False,
            cert_reqs="CERT_REQUIRED",
            ca_certs=self.ca_certs,
            server_hostname=target.host,
            assert_hostname=target.host,
        )


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
