"""ForgeTransport: one HTTP exchange with the forge, paging, and the forge's clock; every
failure is translated into the project's errors here (forge.py builds on it)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from . import crashpoints
from .errors import ForgePermanent, ForgeRetryable
from .forgewire import json_body, server_time, status_error
from .locks import SharedLock
from .neterrors import plain_reason

PAGE_LIMIT = 50
CONNECT_TIMEOUT = 5.0  # seconds to connect; reading an answer may take `timeout` more
LABEL_LOCK_TIMEOUT = 60.0
_NEXT_LINK_RE = re.compile(r'<[^>]*>;\s*rel="next"')
Observer = Callable[[str, str, str, float], None]
"""Told of each forge exchange: method, path, outcome (status code, `timeout`,
`connection`), seconds."""


class ForgeTransport:
    """A retrying (or one-try) Gitea/Forgejo API v1 session, and what every call shares."""

    """A small, retrying Gitea/Forgejo API client over one requests.Session."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        attempts: int = 5,
        max_wait: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        session: requests.Session | None = None,
        label_lock: Path | None = None,
        observe: Observer | None = None,
    ) -> None:
        """`label_lock`: a lock file shared by every process that may create labels in the
        same repos (the service and the CLI use `<state>/labels.lock`). `observe` is told
        of every exchange: (method, path, outcome, seconds), the outcome being the status
        code, `timeout` or `connection` (the metrics count them)."""
        self.base_url = base_url.rstrip("/")
        self.api = f"{self.base_url}/api/v1"
        self.timeout = timeout
        self.attempts = attempts
        self.max_wait = max_wait
        self.sleep = sleep
        self.session = session or requests.Session()
        self.observe = observe
        self.session.headers.update(
            {
                "Authorization": f"token {token}",
                "Accept": "application/json",
                "User-Agent": "dropbox-eval",
            }
        )
        self._login: str | None = None
        self._prepared: dict[tuple[str, str], int] = {}  # (repo, label) -> label id
        self._owner_ids: dict[str, int] = {}  # owner (case-folded) -> user or org id
        self._label_lock: AbstractContextManager[Any] = (
            SharedLock(label_lock, timeout=LABEL_LOCK_TIMEOUT) if label_lock else threading.Lock()
        )
        self._clock = threading.local()  # repos are polled in parallel on one client

    @property
    def listed_at(self) -> datetime | None:
        """The forge's clock at the start of this thread's last listing."""
        moment: datetime | None = getattr(self._clock, "listed_at", None)
        return moment

    @listed_at.setter
    def listed_at(self, moment: datetime | None) -> None:
        self._clock.listed_at = moment

    # -- transport ----------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One HTTP exchange, every failure translated into the project's errors; observed
        around the call, so a timeout or a refused connection is counted too."""
        started = time.monotonic()
        outcome = "connection"
        try:
            response = self.session.request(
                method,
                f"{self.api}{path}",
                timeout=(CONNECT_TIMEOUT, self.timeout),
                allow_redirects=method == "GET",
                **kwargs,
            )
            outcome = str(response.status_code)
        except requests.Timeout as exc:
            outcome = "timeout"
            raise ForgeRetryable(f"{method} {path}: forge timed out") from exc
        except requests.RequestException as exc:
            why = plain_reason(exc)  # no pool reprs or errno in a message
            raise ForgeRetryable(f"{method} {path}: forge unreachable ({why})") from exc
        finally:
            if self.observe is not None:
                self.observe(method, f"/api/v1{path}", outcome, time.monotonic() - started)
        if response.status_code < 300:
            if method not in ("GET", "HEAD"):
                crashpoints.wrote(f"{method} {path}")
            return response
        raise status_error(method, path, response)

    def _request(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> Any:
        """Send (with backoff unless `retry` is false) and return the JSON body."""
        send = self._retrying_send if retry else self._send
        return json_body(send(method, path, **kwargs))

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        hint = getattr(error, "retry_after", None)
        if hint is not None:
            return float(min(hint, self.max_wait))
        backoff = wait_exponential_jitter(multiplier=0.5, max=self.max_wait, jitter=0.5)
        return float(backoff(state))

    def _pages(
        self, path: str, params: dict[str, Any], *, clock: bool = True
    ) -> Iterator[list[Any]]:
        """Every page of a list; stops on a page without `rel="next"` (or a short page when
        the server sends no Link header). With `clock`, sets `listed_at` from the first
        page's Date (a timeline read inside a listing must not move it)."""
        page = 1
        while True:
            response = self._retrying_send(
                "GET", path, params={**params, "page": page, "limit": PAGE_LIMIT}
            )
            if page == 1 and clock:
                self.listed_at = server_time(response)
            items = json_body(response)
            if not isinstance(items, list):
                raise ForgePermanent(f"GET {path}: expected a JSON list")
            yield items
            link = response.headers.get("Link")
            last = (
                (not _NEXT_LINK_RE.search(link)) if link is not None else (len(items) < PAGE_LIMIT)
            )
            if last or not items:
                return
            page += 1

    def _retrying_send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        retrying = Retrying(
            retry=retry_if_exception_type(ForgeRetryable),
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            sleep=self.sleep,
            reraise=True,
        )
        return retrying(self._send, method, path, **kwargs)
