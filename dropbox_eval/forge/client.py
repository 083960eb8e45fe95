"""GiteaClient: the forge operations (Gitea or Forgejo API v1) on forgehttp.py's transport.

Quirks handled here (see README "Forge compatibility"): labels are given by id on create,
`limit` is capped at 50 so lists are paged until a short page, `since` filters on update time,
PATCH answers 201, the timeline of a missing issue answers 500 on Gitea (and pages without
a Link header or a real total, dropping entries after paging), and logins, org and
repo names are case-insensitive.

Labels, which Gitea lets repeat under one name, are forgelabels.py's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from ..config import Settings
from ..errors import ConfigError, ForgeNotFound, ForgePermanent, ForgeRetryable
from .labels import ForgeLabels, label_names
from .transport import PAGE_LIMIT
from .wire import (
    ForgeIssue,
    ForgePull,
    ForgeTimelineEntry,
    covers,
    json_body,
    parse_issue,
    parse_model,
    rfc3339,
    server_time,
)

__all__ = ["PAGE_LIMIT", "ForgeIssue", "ForgePull", "ForgeTimelineEntry", "GiteaClient"]


class UsesForge:
    """A stage that may run without a forge (a CLI command): `gitea` names the missing
    setting in a ConfigError only when the stage really needs it."""

    _gitea: GiteaClient | None
    settings: Settings

    @property
    def has_forge(self) -> bool:
        """Whether a forge client was configured."""
        return self._gitea is not None

    @property
    def gitea(self) -> GiteaClient:
        """The forge client; a ConfigError names the missing setting when there is none."""
        return require_client(self.settings, self._gitea)


def require_client(settings: Settings, client: GiteaClient | None) -> GiteaClient:
    """`client`, or the one-line error naming the setting that is missing."""
    if client is None:
        settings.require_forge()
        raise ConfigError("the forge is configured but this command runs without it")
    return client


class GiteaClient(ForgeLabels):
    """The forge operations this product needs: users and repos, labels, issues."""

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
        return self._create_repo(full_name) or str(
            self._request("GET", f"/repos/{full_name}")["html_url"]
        )

    def prepare_repo(self, full_name: str, label: str, color: str, *, new: bool) -> int:
        """Make sure `full_name` exists with label `label`; returns the label's id.

        `new`: a repo named for a batch recorded just now, which nobody else uses: it is
        created and labelled in two round trips (POST repo, POST label), without looking
        first. Otherwise, what was found once is remembered for the process (a shared repo
        costs nothing after the first batch).
        """
        key = (full_name.casefold(), label)
        if key in self._prepared:
            return self._prepared[key]
        if new and self._create_repo(full_name) is not None:
            # no label lock: nobody else knows a repo created just now (the batch's intake
            # lease keeps out a second opener), so its one label cannot be created twice
            created = self._request(
                "POST", f"/repos/{full_name}/labels", json={"name": label, "color": color}
            )
            return int(created["id"])
        with self._preparing_lock:
            preparing = self._preparing.setdefault(key, threading.Lock())
        with preparing:  # a burst into one shared repo looks at it once, not once a batch
            if key in self._prepared:
                return self._prepared[key]
            self.ensure_repo(full_name)
            label_id = self.ensure_label(full_name, label, color)
            if not new:  # a repo of one batch is not worth remembering
                self._prepared[key] = label_id
        if new:
            with self._preparing_lock:
                self._preparing.pop(key, None)
        return label_id

    def _create_repo(self, full_name: str) -> str | None:
        """POST the repo; its web URL, or None when it exists already (409)."""
        owner, name = full_name.split("/", 1)
        mine = owner.casefold() == self.login().casefold()  # logins are case-insensitive
        path = "/user/repos" if mine else f"/orgs/{owner}/repos"
        body = {"name": name, "description": "dropbox-eval tasks", "private": True}
        try:
            return str(self._request("POST", path, json=body)["html_url"])
        except ForgePermanent as exc:
            if exc.status != 409:
                raise
        return None

    def list_hooks(self, scope: str) -> list[dict[str, Any]]:
        """The webhooks of `/user/hooks` or `/orgs/{org}/hooks`."""
        hooks = self._request("GET", scope)
        return [h for h in hooks if isinstance(h, dict)] if isinstance(hooks, list) else []

    def add_hook(self, scope: str, url: str, secret: str, events: list[str]) -> None:
        """Register a Gitea-type JSON webhook on `scope`."""
        config = {"url": url, "content_type": "json", "secret": secret}
        body = {"type": "gitea", "active": True, "events": events, "config": config}
        self._request("POST", scope, json=body)

    # -- issues -------------------------------------------------------------------------

    def create_issue(self, repo: str, title: str, body: str, label_ids: list[int]) -> ForgeIssue:
        """Create one issue. Never retried blindly: a failed create may still have happened."""
        data = self._request(
            "POST",
            f"/repos/{repo}/issues",
            json={"title": title, "body": body, "labels": label_ids},
        )
        return parse_issue(data)

    def iter_issues(
        self,
        repo: str,
        *,
        state: str = "all",
        labels: str | None = None,
        since: datetime | None = None,
        repair: bool = True,
    ) -> Iterator[ForgeIssue]:
        """Every issue (not PR) matching the filters, newest first, across all pages.

        `labels` are names, ANDed. A naive `since` is taken as UTC. Only issues carrying
        every named label are yielded. A list without `since` that comes back empty is
        retried once after duplicate labels (which make Gitea's filter match nothing) were
        merged; an incremental list is not (that would cost a request per idle poll): the
        full poll's `count_issues` probe heals them (`repair` False: it just did)."""
        params: dict[str, Any] = {"state": state, "type": "issues"}
        names = label_names(labels)
        if names:
            params["labels"] = ",".join(sorted(names))
        if since is not None:
            params["since"] = rfc3339(since)
        for attempt in (1, 2):
            found = False
            for page in self._pages(f"/repos/{repo}/issues", params):
                for issue in map(parse_issue, page):
                    if names.issubset(issue.labels):
                        found = True
                        yield issue
            if found or attempt == 2 or since is not None or not repair:
                return
            if not self._repair_labels(repo, names):
                return

    def search_issues(
        self, owner: str, *, state: str, since: datetime | None
    ) -> Iterator[ForgeIssue]:
        """Issues (not pull requests) changed since `since` in every repo of `owner`, newest
        first, from `/repos/issues/search` (one request per 50, however many repos; each
        issue names its `repo`). No `labels` filter: Gitea resolves a label name to the ids
        of every label of that name in the whole instance (`GetLabelIDsByNames`) and hands
        the indexer that list, which grows with every repo ever labelled; callers tell
        their issues by the marker. Gitea answers from its issue indexer, updated through a
        queue: callers give `since` an overlap for that lag."""
        params: dict[str, Any] = {"owner": owner, "state": state, "type": "issues"}
        if since is not None:
            params["since"] = rfc3339(since)
        for page in self._pages("/repos/issues/search", params):
            yield from map(parse_issue, page)

    def open_counts(self, owner: str) -> dict[str, int]:
        """Open issues (pull requests not counted) of each repo of `owner`, case-folded
        `owner/name` -> count: one request per 50 repos (`/repos/search`). Sets `listed_at`
        to the forge's time of the first page."""
        uid = self._owner_id(owner)
        counts: dict[str, int] = {}
        page = 1
        while True:
            response = self._scheduled(
                "GET",
                "/repos/search",
                params={"uid": uid, "exclusive": "true", "page": page, "limit": PAGE_LIMIT},
            )
            if page == 1:
                self.listed_at = server_time(response)
            found = json_body(response)
            repos = found.get("data") if isinstance(found, dict) else None
            if not isinstance(repos, list):
                raise ForgePermanent("GET /repos/search: expected {data: [...]}")
            for repo in repos:
                counts[str(repo["full_name"]).casefold()] = int(repo["open_issues_count"])
            if len(repos) < PAGE_LIMIT:
                return counts
            page += 1

    def _owner_id(self, owner: str) -> int:
        key = owner.casefold()
        if key not in self._owner_ids:
            self._owner_ids[key] = int(self._request("GET", f"/users/{owner}")["id"])
        return self._owner_ids[key]

    def count_issues(
        self, repo: str, *, state: str, labels: str, since: datetime | None = None
    ) -> int:
        """How many issues match, from `X-Total-Count` of a one-item page (one request, two
        when the answer is 0 and duplicate labels had to be merged first; with `since` a 0
        may be true, so no repair, as `iter_issues`). Sets `listed_at` to the forge's time
        of the count."""
        count = self._count(repo, state, labels, since)
        if count == 0 and since is None and self._repair_labels(repo, label_names(labels)):
            count = self._count(repo, state, labels)
        return count

    def _count(self, repo: str, state: str, labels: str, since: datetime | None = None) -> int:
        params: dict[str, Any] = {"state": state, "type": "issues", "labels": labels}
        if since is not None:
            params["since"] = rfc3339(since)
        response = self._scheduled(
            "GET", f"/repos/{repo}/issues", params={**params, "page": 1, "limit": 1}
        )
        self.listed_at = server_time(response)
        try:
            return int(response.headers["X-Total-Count"])
        except (KeyError, ValueError) as exc:
            raise ForgePermanent(f"GET /repos/{repo}/issues: no X-Total-Count header") from exc

    def get_issue(self, repo: str, number: int) -> ForgeIssue:
        """One issue; ForgeNotFound when deleted."""
        return parse_issue(self._request("GET", f"/repos/{repo}/issues/{number}"))

    def timeline(self, repo: str, issue: ForgeIssue) -> list[ForgeTimelineEntry]:
        """Every timeline entry of an issue, oldest first; ForgeNotFound when the issue is
        gone (Gitea answers 500 there, so a GET of the issue confirms it).

        Gitea pages the timeline before it drops what the caller may not see
        (`ListIssueCommentsAndTimeline`: cross-references from unreadable repos, review
        code comments), and sends no `Link`: a short page is the last one only when what
        was read covers the issue (`forgewire.covers`); else pages are read until an empty
        one."""
        path = f"/repos/{repo}/issues/{issue.number}/timeline"
        entries: list[ForgeTimelineEntry] = []
        pages = self._pages(path, {}, clock=False, covered=lambda: covers(entries, issue))
        try:
            for page in pages:
                entries += [parse_model(ForgeTimelineEntry, item, "timeline") for item in page]
        except ForgeRetryable as exc:
            if exc.status == 500:
                self.get_issue(repo, issue.number)
            raise
        return entries

    def get_pull(self, repo: str, number: int) -> ForgePull:
        """One pull request (merge sha, size); ForgeNotFound when missing."""
        return parse_model(ForgePull, self._request("GET", f"/repos/{repo}/pulls/{number}"), "pull")

    def comment(self, repo: str, number: int, body: str) -> None:
        """Add a comment to an issue."""
        self._request("POST", f"/repos/{repo}/issues/{number}/comments", json={"body": body})

    def close_issue(self, repo: str, number: int) -> None:
        """Close an issue (Gitea answers PATCH with 201)."""
        self._request("PATCH", f"/repos/{repo}/issues/{number}", json={"state": "closed"})
