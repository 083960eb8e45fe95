"""ForgeTransport: one HTTP exchange with the forge, paging, and the forge's clock; every
failure is translated into the project's errors here (forge.py builds on it).

Redirects: Gitea answers a renamed or transferred repo's old path with 307 for every method
(`RedirectToRepo`), which is followed with the method and body kept, the token only to the
forge's own origin. A 301, 302 or 303 to a write (an old release, a proxy) would turn a
POST into a GET, so the write is asked once more at the repo's canonical name instead
(`GET /repos/{o}/{r}` follows to it). Every move seen is remembered (`moved`), so the
callers learn the repo's new full name.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

from ..errors import ForgePermanent, ForgeRetryable
from ..util import crashpoints
from ..util.locks import SharedLock
from ..util.neterrors import plain_reason
from .limiter import Outcome
from .scheduler import ForgeScheduler
from .wire import json_body, server_time, status_error

PAGE_LIMIT = 50
CONNECT_TIMEOUT = 5.0  # seconds to connect; reading an answer may take `timeout` more
LABEL_LOCK_TIMEOUT = 60.0
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
KEEPS_METHOD = frozenset({307, 308})
_NEXT_LINK_RE = re.compile(r'<[^>]*>;\s*rel="next"')
_REPO_PATH_RE = re.compile(r"^/repos/([^/?#]+)/([^/?#]+)")
_DEFAULT_PORTS = {"http": 80, "https": 443}

Observer = Callable[[str, str, str, float], None]
"""Told of each forge exchange: method, path, outcome (status code, `timeout`,
`connection`), seconds."""


def freeze_environment(session: requests.Session, url: str) -> None:
    """Read the proxy and CA-bundle settings of the environment for `url` once, as
    requests would on every call (`trust_env`): that read walks the whole environment
    and cost about 90 us a request. A `.netrc` is not consulted: the token is the
    credential, and a netrc entry would replace its header."""
    session.proxies.update(requests.utils.get_environ_proxies(url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle and session.verify is True:
        session.verify = bundle
    session.trust_env = False


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
        observe: Observer | None = None,
    ) -> None:
        """`label_lock`: a lock file shared by every process that may create labels in the
        same repos (the service and the CLI use `<state>/labels.lock`). `scheduler`: the
        fair gate every exchange waits at (none: each goes at once). `observe` is told of
        every exchange: (method, path, outcome, seconds), the outcome being the status
        code, `timeout` or `connection` (the metrics count them)."""
        self.scheduler = scheduler
        self.base_url = base_url.rstrip("/")
        self.api = f"{self.base_url}/api/v1"
        self.timeout = timeout
        self.session = session or requests.Session()
        freeze_environment(self.session, self.base_url)
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
        self._preparing: dict[tuple[str, str], threading.Lock] = {}  # one look per repo
        self._preparing_lock = threading.Lock()
        self._owner_ids: dict[str, int] = {}  # owner (case-folded) -> user or org id
        self._label_lock: AbstractContextManager[Any] = (
            SharedLock(label_lock, timeout=LABEL_LOCK_TIMEOUT) if label_lock else threading.Lock()
        )
        self._clock = threading.local()  # repos are polled in parallel on one client
        self._moves: dict[str, str] = {}  # case-folded old `owner/name` -> the new one

    @property
    def listed_at(self) -> datetime | None:
        """The forge's clock at the start of this thread's last listing."""
        moment: datetime | None = getattr(self._clock, "listed_at", None)
        return moment

    @listed_at.setter
    def listed_at(self, moment: datetime | None) -> None:
        self._clock.listed_at = moment

    @property
    def read_at(self) -> datetime | None:
        """The forge's clock at the start of this thread's last paged read (a listing or
        an issue's timeline): what that read showed was the forge's state then."""
        moment: datetime | None = getattr(self._clock, "read_at", None)
        return moment

    # -- transport ----------------------------------------------------------------------

    def moved(self, repo: str) -> str | None:
        """The current `owner/name` of `repo` when the forge said it moved, else None."""
        current, seen = repo, {repo.casefold()}
        while (after := self._moves.get(current.casefold())) is not None:
            current = after
            if current.casefold() in seen:  # renamed back and forth: the latest wins
                break
            seen.add(current.casefold())
        return None if current.casefold() == repo.casefold() else current

    def note_move(self, old: str, new: str) -> None:
        """Remember that repo `old` is now `new` (the forge redirected a request for it)."""
        if old.casefold() != new.casefold():
            self._moves[old.casefold()] = new

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
                allow_redirects=False,
                **kwargs,
            )
            if response.status_code in REDIRECTS:
                response = self._follow(method, path, response, kwargs)
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

    def _scheduled(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One exchange, once the scheduler gives it a slot."""
        if self.scheduler is None:
            return self._send(method, path, **kwargs)
        return self.scheduler.call(self._send, method, path, **kwargs)

    def _follow(
        self, method: str, path: str, response: requests.Response, kwargs: dict[str, Any]
    ) -> requests.Response:
        """Follow 307/308 (and any redirect of a read) with the method and body kept, the
        token only to the forge's origin; a write redirected otherwise is re-asked once at
        the repo's canonical name. The query travels in the `Location`."""
        resend = {key: value for key, value in kwargs.items() if key != "params"}
        for _hop in range(MAX_REDIRECTS):
            target = urljoin(response.url, response.headers.get("Location", ""))
            self._note_redirect(path, target)
            if response.status_code not in KEEPS_METHOD and method not in ("GET", "HEAD"):
                return self._reask(method, path, kwargs)
            headers = {} if _same_origin(target, self.api) else {"Authorization": None}
            response = self.session.request(
                method,
                target,
                timeout=(CONNECT_TIMEOUT, self.timeout),
                allow_redirects=False,
                headers=headers,
                **resend,
            )
            if response.status_code not in REDIRECTS:
                return response
        raise ForgePermanent(f"{method} {path}: more than {MAX_REDIRECTS} redirects")

    def _reask(self, method: str, path: str, kwargs: dict[str, Any]) -> requests.Response:
        """A write the forge moved with 301/302/303: once more at the canonical name."""
        match = _REPO_PATH_RE.match(path)
        if match is None:
            raise ForgePermanent(f"{method} {path}: the forge redirected a write elsewhere")
        repo = f"{match.group(1)}/{match.group(2)}"
        canonical = str(json_body(self._send("GET", f"/repos/{repo}"))["full_name"])
        self.note_move(repo, canonical)
        return self.session.request(
            method,
            f"{self.api}/repos/{canonical}{path[match.end() :]}",
            timeout=(CONNECT_TIMEOUT, self.timeout),
            allow_redirects=False,
            **kwargs,
        )

    def _note_redirect(self, path: str, target: str) -> None:
        asked = _REPO_PATH_RE.match(path)
        where = urlsplit(target).path.removeprefix(urlsplit(self.api).path)
        landed = _REPO_PATH_RE.match(where)
        if asked is not None and landed is not None:
            self.note_move(f"{asked[1]}/{asked[2]}", f"{landed[1]}/{landed[2]}")

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send once (attempts.py decides any next try) and return the JSON body."""
        return json_body(self._scheduled(method, path, **kwargs))

    def _pages(
        self,
        path: str,
        params: dict[str, Any],
        *,
        clock: bool = True,
        covered: Callable[[], bool] | None = None,
    ) -> Iterator[list[Any]]:
        """Every page of a list; stops on a page without `rel="next"`, or, when the server
        sends no Link header, on a short page (only once `covered()` says the pages read so
        far hold everything, else on an empty page). Sets `read_at` from the first page's
        Date, and with `clock` `listed_at` too (a timeline read inside a listing must not
        move it)."""
        page = 1
        while True:
            response = self._scheduled(
                "GET", path, params={**params, "page": page, "limit": PAGE_LIMIT}
            )
            if page == 1:
                self._clock.read_at = server_time(response)
                if clock:
                    self.listed_at = self._clock.read_at
            items = json_body(response)
            if not isinstance(items, list):
                raise ForgePermanent(f"GET {path}: expected a JSON list")
            yield items
            link = response.headers.get("Link")
            short = len(items) < PAGE_LIMIT and (covered is None or covered())
            last = (not _NEXT_LINK_RE.search(link)) if link is not None else short
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


def _same_origin(url: str, base: str) -> bool:
    """Whether `url` is on the forge's origin (scheme, host, port): only there is the
    token sent."""
    one, two = urlsplit(url), urlsplit(base)
    ports = (one.port or _DEFAULT_PORTS.get(one.scheme), two.port or _DEFAULT_PORTS.get(two.scheme))
    return (one.scheme, (one.hostname or "").lower()) == (
        two.scheme,
        (two.hostname or "").lower(),
    ) and ports[0] == ports[1]
