"""The signed POST of a report to its callback URL: one attempt per call (attempts.py decides
the next). The boundary for its errors: whatever urllib3 raises becomes a DeliveryError.

The POST goes to an address the CallbackPolicy checked moments before (the host name is
never resolved again), and the socket's peer is compared with that address once connected.
The Host header and the TLS server name and certificate check keep the URL's host name.
No proxy from the environment is used and redirects are not followed. A whole exchange has
one deadline (`Deadline`), connecting included.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from typing import Any

import requests.utils
import urllib3
from standardwebhooks import Webhook
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError, NewConnectionError

from ..errors import DeliveryError
from ..models import utcnow
from ..protocol.callbacks import CallbackTarget
from ..util import crashpoints
from ..util.neterrors import plain_reason
from ..util.redact import shown_url


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
