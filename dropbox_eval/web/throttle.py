"""Sign-in attempts of the operator page, throttled per source address.

The first FREE_FAILURES wrong keys from an address cost nothing (typing errors); each one
after that closes the address's door for twice as long as the one before (1 s, 2 s, 4 s ...
up to MAX_DELAY). While the door is closed every attempt is answered 429 with
`Retry-After`, the right key included and without looking at it, so guessing runs at the
throttle's pace whatever the request rate. A sign-in with the right key forgets the
address's failures; failures older than FORGET_AFTER are forgotten too. At most
MAX_SOURCES addresses are remembered (the oldest goes first), so memory stays bounded.

The source address is the peer's, unless the peer is a reverse proxy listed in
SAAS_EVAL_TRUSTED_PROXIES: only then is `X-Forwarded-For` believed (`trust_proxies`). The
servers themselves believe no header (uvicorn's `proxy_headers` is off: by default it
trusts any loopback peer, so a header sent from the host itself would open a fresh bucket).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from fastapi import FastAPI
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

FREE_FAILURES = 3
FIRST_DELAY = 1.0
MAX_DELAY = 300.0
FORGET_AFTER = 3600.0
MAX_SOURCES = 10_000


@dataclass
class _Record:
    failures: int
    last_failure: float
    closed_until: float


class LoginThrottle:
    """Failed sign-ins per source address (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` is injectable for tests; monotonic by default."""
        self.clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, source: str) -> int:
        """Whole seconds until `source` may try again; 0 when it may now."""
        with self._lock:
            record = self._records.get(source)
            if record is None:
                return 0
            return max(0, math.ceil(record.closed_until - self.clock()))

    def failed(self, source: str) -> int:
        """Count a wrong key from `source`; returns the seconds it must now wait."""
        with self._lock:
            return self._fail(source)

    def _fail(self, source: str) -> int:
        now = self.clock()
        record = self._records.pop(source, None)
        if record is None or now - record.last_failure > FORGET_AFTER:
            record = _Record(0, now, now)
        record.failures += 1
        record.last_failure = now
        record.closed_until = now + _delay(record.failures)
        self._records[source] = record
        while len(self._records) > MAX_SOURCES:
            self._records.popitem(last=False)
        return math.ceil(record.closed_until - now)

    def attempt(self, source: str) -> int:
        """Admit one sign-in from `source`, counted as a wrong key until `succeeded` says
        otherwise (so concurrent guesses cannot all slip through an open door); returns
        the seconds it must wait instead, 0 when admitted."""
        with self._lock:
            record = self._records.get(source)
            if record is not None:
                wait = math.ceil(record.closed_until - self.clock())
                if wait > 0:
                    return wait
            self._fail(source)
            return 0

    def succeeded(self, source: str) -> None:
        """The right key: forget the failures of `source`."""
        with self._lock:
            self._records.pop(source, None)


def trust_proxies(api: FastAPI, proxies: tuple[IPv4Network | IPv6Network, ...]) -> None:
    """Take a request's client address (and scheme) from `X-Forwarded-For` (`-Proto`) only
    when its peer is one of `proxies` (the last address in the header that is not a
    trusted proxy); with none, the header is never read."""
    if proxies:
        trusted = ",".join(str(network) for network in proxies)
        api.add_middleware(ProxyHeadersMiddleware, trusted_hosts=trusted)


def _delay(failures: int) -> float:
    """Seconds the door stays closed after the `failures`th wrong key in a row."""
    if failures <= FREE_FAILURES:
        return 0.0
    doublings = min(failures - FREE_FAILURES - 1, 32)  # past MAX_DELAY long before
    return min(MAX_DELAY, FIRST_DELAY * float(2**doublings))
