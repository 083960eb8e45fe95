"""GiteaClient: the only module that speaks HTTP to the forge (Gitea or Forgejo API v1).

Quirks handled here (see README "Forge compatibility"): labels are given by id on create,
`limit` is capped at 50 so lists are paged until a short page, `since` filters on update time,
PATCH answers 201, the comments of a missing issue answer 500 on Gitea, and duplicate label
names are allowed (so labels are listed before one is created).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from pydantic import BaseModel, ValidationError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from .errors import (
    ForgeAuthError,
    ForgeError,
    ForgeNotFound,
    ForgePermanent,
    ForgeRetryable,
)

PAGE_LIMIT = 50
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_NEXT_LINK_RE = re.compile(r'<[^>]*>;\s*rel="next"')


class ForgeIssue(BaseModel):
    """The parts of a Gitea issue this product reads."""

    number: int
    title: str
    body: str = ""
    state: str
    labels: list[str]
    html_url: str
    updated_at: datetime
    closed_at: datetime | None = None


class ForgeComment(BaseModel):
    """One issue comment."""

    id: int
    body: str
    created_at: datetime


def _issue(data: Any) -> ForgeIssue:
    try:
        labels = [str(label["name"]) for label in data.get("labels") or []]
        return ForgeIssue.model_validate({**data, "labels": labels})
    except (AttributeError, KeyError, TypeError, ValidationError) as exc:
        raise ForgePermanent(f"unexpected issue JSON from forge: {exc}") from exc


class GiteaClient:
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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api = f"{self.base_url}/api/v1"
        self.timeout = timeout
        self.attempts = attempts
        self.max_wait = max_wait
        self.sleep = sleep
        self.session = session or requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"token {token}",
                "Accept": "application/json",
                "User-Agent": "dropbox-eval",
            }
        )
        self._login: str | None = None
        self.listed_at: datetime | None = None  # forge clock at the start of the last list

    # -- transport ----------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One HTTP exchange, every failure translated into the project's errors."""
        try:
            response = self.session.request(
                method, f"{self.api}{path}", timeout=(5.0, self.timeout),
                allow_redirects=method == "GET", **kwargs,
            )
        except requests.Timeout as exc:
            raise ForgeRetryable(f"{method} {path}: forge timed out ({exc})") from exc
        except requests.RequestException as exc:
            raise ForgeRetryable(f"{method} {path}: forge unreachable ({exc})") from exc
        if response.status_code < 300:
            return response
        raise _status_error(method, path, response)

    def _request(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> Any:
        """Send (with backoff unless `retry` is false) and return the JSON body."""
        send = self._retrying_send if retry else self._send
        return _json(send(method, path, **kwargs))

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        hint = getattr(error, "retry_after", None)
        if hint is not None:
            return float(min(hint, self.max_wait))
        backoff = wait_exponential_jitter(multiplier=0.5, max=self.max_wait, jitter=0.5)
        return float(backoff(state))

    def _pages(self, path: str, params: dict[str, Any]) -> Iterator[list[Any]]:
        """Every page of a list; stops on a page without `rel="next"` (or a short page when
        the server sends no Link header). Sets `listed_at` from the first page's Date."""
        page = 1
        while True:
            response = self._retrying_send("GET", path, params={**params, "page": page,
                                                                "limit": PAGE_LIMIT})
            if page == 1:
                self.listed_at = _server_time(response)
            items = _json(response)
            if not isinstance(items, list):
                raise ForgePermanent(f"GET {path}: expected a JSON list")
            yield items
            link = response.headers.get("Link")
            last = (not _NEXT_LINK_RE.search(link)) if link is not None else (
                len(items) < PAGE_LIMIT)
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

    # -- users and repos ----------------------------------------------------------------

    def version(self) -> str:
        """The server's version string."""
        return str(self._request("GET", "/version").get("version", ""))

    def login(self) -> str:
        """The token's user name (cached)."""
        if self._login is None:
            self._login = str(self._request("GET", "/user")["login"])
        return self._login

    def ensure_repo(self, full_name: str) -> str:
        """Create `owner/name` if missing (user or org repo); return its web URL."""
        try:
            return str(self._request("GET", f"/repos/{full_name}")["html_url"])
        except ForgeNotFound:
            pass
        owner, name = full_name.split("/", 1)
        path = "/user/repos" if owner == self.login() else f"/orgs/{owner}/repos"
        body = {"name": name, "description": "dropbox-eval tasks", "private": True}
        try:
            return str(self._request("POST", path, json=body)["html_url"])
        except ForgePermanent as exc:
            if exc.status != 409:
                raise
        return str(self._request("GET", f"/repos/{full_name}")["html_url"])

    def ensure_label(self, repo: str, name: str, color: str) -> int:
        """The id of label `name` in `repo`, created if missing (lowest id if duplicated)."""
        labels = self._request("GET", f"/repos/{repo}/labels")
        ids = sorted(int(lab["id"]) for lab in labels if lab.get("name") == name)
        if ids:
            return ids[0]
        created = self._request("POST", f"/repos/{repo}/labels",
                                json={"name": name, "color": color})
        return int(created["id"])

    # -- issues -------------------------------------------------------------------------

    def create_issue(self, repo: str, title: str, body: str, label_ids: list[int]) -> ForgeIssue:
        """Create one issue. Never retried blindly: a failed create may still have happened."""
        data = self._request("POST", f"/repos/{repo}/issues", retry=False,
                             json={"title": title, "body": body, "labels": label_ids})
        return _issue(data)

    def iter_issues(
        self, repo: str, *, state: str = "all", labels: str | None = None,
        since: datetime | None = None,
    ) -> Iterator[ForgeIssue]:
        """Every issue (not PR) matching the filters, newest first, across all pages."""
        params: dict[str, Any] = {"state": state, "type": "issues"}
        if labels:
            params["labels"] = labels
        if since is not None:
            params["since"] = since.isoformat()
        for page in self._pages(f"/repos/{repo}/issues", params):
            for item in page:
                yield _issue(item)

    def count_issues(self, repo: str, *, state: str, labels: str) -> int:
        """How many issues match, from `X-Total-Count` of a one-item page (one request)."""
        response = self._retrying_send("GET", f"/repos/{repo}/issues", params={
            "state": state, "type": "issues", "labels": labels, "page": 1, "limit": 1})
        try:
            return int(response.headers["X-Total-Count"])
        except (KeyError, ValueError) as exc:
            raise ForgePermanent(f"GET /repos/{repo}/issues: no X-Total-Count header") from exc

    def get_issue(self, repo: str, number: int) -> ForgeIssue:
        """One issue; ForgeNotFound when deleted."""
        return _issue(self._request("GET", f"/repos/{repo}/issues/{number}"))

    def list_comments(self, repo: str, number: int) -> list[ForgeComment]:
        """All comments of an issue, oldest first; ForgeNotFound when the issue is gone."""
        try:
            data = self._request("GET", f"/repos/{repo}/issues/{number}/comments")
        except ForgeRetryable as exc:
            if exc.status == 500:  # Gitea answers 500 for the comments of a missing issue
                self.get_issue(repo, number)
            raise
        try:
            return [ForgeComment.model_validate(item) for item in data]
        except (TypeError, ValidationError) as exc:
            raise ForgePermanent(f"unexpected comments JSON from forge: {exc}") from exc

    def comment(self, repo: str, number: int, body: str) -> None:
        """Add a comment to an issue."""
        self._request("POST", f"/repos/{repo}/issues/{number}/comments", json={"body": body})

    def add_labels(self, repo: str, number: int, label_ids: list[int]) -> None:
        """Add labels (by id) to an issue."""
        self._request("POST", f"/repos/{repo}/issues/{number}/labels",
                      json={"labels": label_ids})

    def close_issue(self, repo: str, number: int) -> None:
        """Close an issue (Gitea answers PATCH with 201)."""
        self._request("PATCH", f"/repos/{repo}/issues/{number}", json={"state": "closed"})


def _json(response: requests.Response) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise ForgePermanent(
            f"{response.request.method} {response.url}: forge sent non-JSON "
            f"({response.headers.get('Content-Type', '?')})", response.status_code
        ) from exc


def _status_error(method: str, path: str, response: requests.Response) -> ForgeError:
    status = response.status_code
    message = f"{method} {path}: HTTP {status} {_message(response)}".rstrip()
    if status in RETRYABLE_STATUSES:
        return ForgeRetryable(message, status, _retry_after(response))
    if status == 401:
        return ForgeAuthError(f"{message} (check SAAS_EVAL_GITEA_TOKEN)", status)
    if status == 403:
        return ForgeAuthError(f"{message} (the token lacks a permission or scope)", status)
    if status == 404:
        return ForgeNotFound(message, status)
    return ForgePermanent(message, status)


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return ""


def _server_time(response: requests.Response) -> datetime | None:
    try:
        return parsedate_to_datetime(response.headers["Date"])
    except (KeyError, TypeError, ValueError):
        return None


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
