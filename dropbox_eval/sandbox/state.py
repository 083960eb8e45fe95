"""Thread-safe in-memory data of the sandbox forge (pure Python, no HTTP).

Every public method takes `self.lock` and returns Gitea-shaped JSON dicts, so callers
never see records while another thread mutates them. Accounts, repos and labels live in
`state_base`, pull requests in `state_pulls`; this module holds issues and comments.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from .errors import ForgeError
from .models import JSON, Account, Comment, Issue, Repo
from .query import IssueQuery, page_size
from .state_base import LANE_BOT
from .state_pulls import PullsMixin
from .timeline import entries, entry_json, in_window

__all__ = ["LANE_BOT", "ForgeState"]


class ForgeState(PullsMixin):
    """Users/orgs, repos, labels, issues, pull requests and comments of one sandbox forge."""

    # ----- issues -------------------------------------------------------------------------
    def create_issue(
        self,
        owner: str,
        name: str,
        poster: str,
        title: str,
        *,
        body: str = "",
        labels: Iterable[int] = (),
        assignees: Iterable[str] = (),
        closed: bool = False,
    ) -> JSON:
        """Create an issue; unknown label ids are silently dropped (like Gitea)."""
        if not title.strip():
            raise ForgeError(422, "[Title]: Required")
        with self.lock:
            repo = self._repo(owner, name)
            people = [self._assignee(login) for login in assignees]
            issue = self._new_issue(repo, self._account(poster), title, body)
            issue.assignees = people
            self._add_labels(
                issue, [repo.labels[i] for i in labels if i in repo.labels], issue.poster
            )
            if closed:
                self._set_closed(issue, True, issue.poster)
            return issue.to_json(self.base_url)

    def _assignee(self, login: str) -> Account:
        account = self.accounts.get(login.lower())
        if account is None or account.is_org:
            raise ForgeError(422, f"Assignee does not exist: [name: {login}]")
        return account

    def get_issue(self, owner: str, name: str, number: int) -> JSON:
        """Return one issue (a PR number gives the PR as an issue); 404 if missing."""
        with self.lock:
            return self._issue(self._repo(owner, name), number).to_json(self.base_url)

    def list_issues(self, owner: str, name: str, query: IssueQuery) -> tuple[list[JSON], int]:
        """Filter (state, type, labels AND, updated since/before) newest first; (page, total)."""
        with self.lock:
            repo = self._repo(owner, name)
            matches = list(self._matching(repo, query))
            start = (query.page - 1) * query.limit
            chosen = matches[start : start + query.limit]
            return [issue.to_json(self.base_url) for issue in chosen], len(matches)

    def search_issues(self, owner: str | None, query: IssueQuery) -> tuple[list[JSON], int]:
        """Issues across repos (of `owner`), newest first; labels ORed; an issue changed
        within the last `indexer_lag` seconds is not seen yet (Gitea's async indexer)."""
        with self.lock:
            horizon = time.time() - self.indexer_lag
            found = [
                issue
                for repo in self.repos.values()
                if owner is None or repo.owner.login.lower() == owner.lower()
                for issue in self._matching(repo, query, any_label=True)
                if issue.updated <= horizon
            ]
            found.sort(key=lambda issue: (issue.created, issue.id), reverse=True)
            start = (query.page - 1) * query.limit
            chosen = found[start : start + query.limit]
            return [issue.to_json(self.base_url) for issue in chosen], len(found)

    def repos_of(self, uid: int | None) -> list[JSON]:
        """The repos owned by account `uid` (every repo without one), oldest first."""
        with self.lock:
            return [
                repo.to_json(self.base_url)
                for repo in self.repos.values()
                if uid is None or repo.owner.id == uid
            ]

    def is_org(self, login: str) -> bool:
        """Whether `login` is an organization."""
        with self.lock:
            account = self.accounts.get(login.lower())
            return account is not None and account.is_org

    def _matching(
        self, repo: Repo, query: IssueQuery, *, any_label: bool = False
    ) -> Iterator[Issue]:
        wanted = {lb.id for lb in repo.labels.values() if lb.name in query.labels}
        state, since, before = query.state, query.since, query.before
        for issue in reversed(repo.issues.values()):
            if (query.pulls_only and not issue.is_pull) or (query.issues_only and issue.is_pull):
                continue
            if state != "all" and (issue.closed is None) != (state == "open"):
                continue
            if since is not None and int(issue.updated) < since:
                continue
            if before is not None and int(issue.updated) > before:
                continue
            if wanted and not (
                wanted & issue.labels.keys() if any_label else wanted.issubset(issue.labels)
            ):
                continue
            yield issue

    def edit_issue(
        self,
        owner: str,
        name: str,
        number: int,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        doer: str | None = None,
    ) -> JSON:
        """Edit title/body/state (empty title ignored like Gitea); 412 on an unknown state."""
        if state is not None and state not in ("open", "closed"):
            raise ForgeError(412, f"unknown state: {state}")
        with self.lock:
            issue = self._issue(self._repo(owner, name), number)
            if state is not None and issue.pull is not None and issue.pull.merged is not None:
                raise ForgeError(
                    412, "cannot change state of this pull request, it was already merged"
                )
            if title:
                issue.title = self.flavor.cut_title(title)
            if body is not None:
                issue.body = body
            issue.updated = time.time()
            if state is not None:
                actor = self._account(doer) if doer else self.user
                self._set_closed(issue, state == "closed", actor)
            return issue.to_json(self.base_url)

    def delete_issue(self, owner: str, name: str, number: int) -> None:
        """Delete an issue and its comments; numbers are never reused."""
        with self.lock:
            repo = self._repo(owner, name)
            issue = self._issue(repo, number)
            del repo.issues[number]
            self.open_issues.pop(issue.id, None)
            for comment in issue.comments:
                repo.comments.pop(comment.id, None)

    def all_issues(self, owner: str, name: str) -> list[JSON]:
        """Every issue and PR of a repo in creation order."""
        with self.lock:
            repo = self._repo(owner, name)
            return [issue.to_json(self.base_url) for issue in repo.issues.values()]

    # ----- comments and timeline ----------------------------------------------------------
    def issue_comments(
        self,
        owner: str,
        name: str,
        number: int,
        since: int | None = None,
        before: int | None = None,
    ) -> list[JSON]:
        """All comments of an issue, oldest first; a missing issue: Gitea 500, Forgejo 404."""
        with self.lock:
            issue = self._issue(self._repo(owner, name), number, quirk=True)
            chosen = _in_window(issue.comments, since, before)
            return [comment.to_json(self.base_url) for comment in chosen]

    def create_comment(self, owner: str, name: str, number: int, poster: str, body: str) -> JSON:
        """Add a comment and bump the issue; a missing issue: Gitea 500, Forgejo 404."""
        if not body:
            raise ForgeError(422, "[Body]: Required")
        with self.lock:
            issue = self._issue(self._repo(owner, name), number, quirk=True)
            return self._add_comment(issue, self._account(poster), body).to_json(self.base_url)

    def timeline(
        self,
        owner: str,
        name: str,
        number: int,
        *,
        since: int | None = None,
        before: int | None = None,
        page: int | None = None,
        limit: int | None = None,
    ) -> list[JSON]:
        """Comments and events oldest first; all of them unless `page` >= 1 (like Gitea)."""
        with self.lock:
            issue = self._issue(self._repo(owner, name), number, quirk=True)
            chosen = in_window(entries(issue), since, before)
            if page is not None and page > 0:
                size = page_size(limit)
                chosen = chosen[(page - 1) * size : page * size]
            return [entry_json(entry, self.base_url) for entry in chosen]

    def repo_comments(
        self,
        owner: str,
        name: str,
        *,
        since: int | None = None,
        before: int | None = None,
        page: int | None = None,
        limit: int | None = None,
    ) -> tuple[list[JSON], int]:
        """Repo-wide comments oldest first; unpaginated unless `page` >= 1. (page, total)."""
        with self.lock:
            repo = self._repo(owner, name)
            chosen = _in_window(repo.comments.values(), since, before)
            total = len(chosen)
            if page is not None and page > 0:
                size = page_size(limit)
                chosen = chosen[(page - 1) * size : page * size]
            return [comment.to_json(self.base_url) for comment in chosen], total

    # ----- issue labels and finishing -----------------------------------------------------
    def issue_labels(self, owner: str, name: str, number: int) -> list[JSON]:
        """Labels on an issue."""
        with self.lock:
            repo = self._repo(owner, name)
            return self._labels_json(repo, self._issue(repo, number).label_list())

    def add_issue_labels(
        self,
        owner: str,
        name: str,
        number: int,
        ids: Iterable[int] = (),
        names: Iterable[str] = (),
        doer: str | None = None,
    ) -> list[JSON]:
        """Add repo labels by id and/or name (unknown ones ignored); returns all labels."""
        with self.lock:
            repo = self._repo(owner, name)
            issue = self._issue(repo, number)
            wanted, by_name = set(ids), set(names)
            chosen = [lb for lb in repo.labels.values() if lb.id in wanted or lb.name in by_name]
            self._add_labels(issue, chosen, self._account(doer) if doer else self.user)
            return self._labels_json(repo, issue.label_list())

    def finish_issue(
        self,
        owner: str,
        name: str,
        number: int,
        *,
        comment: str | None,
        labels: list[str],
        author: str = LANE_BOT,
    ) -> None:
        """Comment (if any), add labels by name (creating missing ones), then close."""
        with self.lock:
            issue = self._issue(self._repo(owner, name), number)
            self.finish(issue, comment=comment, labels=labels, author=author)

    def finish(
        self, issue: Issue, *, comment: str | None, labels: list[str], author: str = LANE_BOT
    ) -> None:
        """`finish_issue` on a record the caller already holds."""
        with self.lock:
            if comment:
                self.comment_on(issue, comment, author)
            self.label_named(issue, labels, author)
            self.close(issue, author)

    def comment_on(self, issue: Issue, body: str, author: str = LANE_BOT) -> None:
        """Comment on a record the caller holds."""
        with self.lock:
            self._add_comment(issue, self._account(author), body)

    def label_named(self, issue: Issue, names: list[str], author: str = LANE_BOT) -> None:
        """Add labels by name (creating missing ones) to a record the caller holds."""
        with self.lock:
            self._add_labels(issue, self._labels_named(issue.repo, names), self._account(author))

    def close(self, issue: Issue, author: str = LANE_BOT) -> None:
        """Close a record the caller holds (a `close` event unless already closed)."""
        with self.lock:
            self._set_closed(issue, True, self._account(author))


def _in_window(comments: Iterable[Comment], since: int | None, before: int | None) -> list[Comment]:
    """Comments whose whole-second `updated` lies in [since, before]."""
    return [
        c
        for c in comments
        if (since is None or int(c.updated) >= since)
        and (before is None or int(c.updated) <= before)
    ]
