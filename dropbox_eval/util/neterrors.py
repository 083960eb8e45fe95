"""A network failure in plain words, for messages an operator or a client reads.

requests and urllib3 wrap the socket's error in layers whose text repeats class names,
object addresses and errno (`HTTPConnectionPool(host=...): Max retries exceeded ...
(Caused by NewConnectionError(...: [Errno 111] Connection refused))`); `plain_reason` walks
the layers for the cause and names it: "connection refused", "timed out", "TLS error: ...".
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

_NAMED: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (socket.gaierror, "the host name does not resolve"),
    (ConnectionResetError, "the connection was dropped"),
    (TimeoutError, "timed out"),  # socket.timeout too; urllib3's timeouts wrap one
)


def plain_reason(error: BaseException) -> str:
    """What went wrong on the network, without library class names, addresses or errno."""
    layers = list(_layers(error))
    tls = next((e for e in layers if isinstance(e, ssl.SSLError)), None)
    if tls is not None:
        code = str(getattr(tls, "reason", None) or "").replace("_", " ").lower()
        return f"TLS error: {getattr(tls, 'verify_message', None) or code or 'handshake failed'}"
    for kind, words in _NAMED:
        if any(isinstance(e, kind) for e in layers):
            return words
    innermost = layers[-1]
    if isinstance(innermost, OSError) and innermost.strerror:
        return innermost.strerror.lower()
    # urllib3 writes "<connection repr>: <message>": keep the message
    return str(innermost).rpartition(": ")[2] or "the connection failed"


def _layers(error: BaseException) -> Iterator[BaseException]:
    """`error` and every exception it wraps (cause, context, `reason`, exception args)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inner = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        inner += list(current.args)
        todo += [e for e in inner if isinstance(e, BaseException)]
