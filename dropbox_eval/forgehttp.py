"""ForgeTransport: one HTTP exchange with the forge, paging, and the forge's clock; every
failure is translated into the project's errors here (forge.py builds on it)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from . import crashpoints
from .errors import ForgePermanent, ForgeRetryable
from .forgewire import json_body, server_time, status_error
from .limiter import Outcome
from .locks import SharedLock
from .neterrors import plain_reason
from .scheduler import ForgeScheduler

PAGE_LIMIT = 50
LABEL_LOCK_TIMEOUT = 60.0
_NEXT_LINK_RE = re.compile(r'<[^>]*>;\s*rel="next"')


class ForgeTransport:
    """A Gitea/Forgejo API v1 session, and what every call shares: each exchange is tried
    once, after waiting its turn at the scheduler (attempts.py decides any next try)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        label_lock: Path | None = None,
        scheduler: ForgeScheduler | None = None,
    ) -> None:
        """`label_lock`: a lock file shared by every process that may create labels in the
        same repos (the service and the CLI use `<state>/labels.lock`). `scheduler`: the
        fair gate every exchange waits at (none: each goes at once)."""
        self.scheduler = scheduler
        self.base_url = base_url.rstrip("/")
        self.api = f"{self.base_url}/api/v1"
        self.timeout = timeout
        self.session = session or requests.Session()
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
        """One HTTP exchange, every failure translated into the project's errors."""
        try:
            response = self.session.request(
                method,
                f"{self.api}{path}",
                timeout=(5.0, self.timeout),
                allow_redirects=method == "GET",
                **kwargs,
            )
        except requests.Timeout as exc:
            raise ForgeRetryable(f"{method} {path}: forge timed out") from exc
        except requests.RequestException as exc:
            why = plain_reason(exc)  # no pool reprs or errno in a message
            raise ForgeRetryable(f"{method} {path}: forge unreachable ({why})") from exc
        if response.status_code < 300:
            if method not in ("GET", "HEAD"):
                crashpoints.wrote(f"{method} {path}")
            return response
        raise status_error(method, path, response)

    def _scheduled(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One exchange, once the scheduler gives it a slot."""
        if self.scheduler is None:
            return self._send(method, path, **kwargs)
        return self.scheduler.call(self._send, method, path, **kwargs)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send once (attempts.py decides any next try) and return the JSON body."""
        return json_body(self._scheduled(method, path, **kwargs))

    def _pages(
        self, path: str, params: dict[str, Any], *, clock: bool = True
    ) -> Iterator[list[Any]]:
        """Every page of a list; stops on a page without `rel="next"` (or a short page when
        the server sends no Link header). With `clock`, sets `listed_at` from the first
        page's Date (a timeline read inside a listing must not move it)."""
        page = 1
        while True:
            response = self._scheduled(
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


def forge_outcome(error: BaseException) -> Outcome:
    """What the in-flight budget learns from a failed exchange: 5xx, 429, timeouts and
    unreachable are overload (with the forge's Retry-After); a 4xx says nothing of load."""
    if isinstance(error, ForgeRetryable) and error.status not in _NOT_OVERLOAD:
        return Outcome(0.0, overloaded=True, retry_after=error.retry_after)
    return Outcome(0.0)


_NOT_OVERLOAD = frozenset({404, 408, 409})
