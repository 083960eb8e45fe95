"""Thread-safe in-memory data of the sandbox forge (pure Python, no HTTP).

Every public method takes `self.lock` and returns Gitea-shaped JSON dicts, so callers
never see records while another thread mutates them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Iterator

from .errors import ForgeError, NotFoundError
from .faults import Faults, RequestLog
from .models import JSON, Account, Comment, Issue, Label, Repo
from .query import REPO_NAME, IssueQuery, normalize_color, page_size

LANE_BOT = "lane-bot"
TITLE_MAX = 255


class ForgeState:
    """Users/orgs, repos, labels, issues and comments of one sandbox forge."""

    def __init__(
        self, *, token: str = "sandbox-token", user: str = "eval", org: str = "evalorg",
        base_url: str = "http://127.0.0.1",
    ) -> None:
        self.lock = threading.RLock()
        self.base_url = base_url
        self.faults = Faults()
        self.log = RequestLog()
        self._ids = {kind: itertools.count(1) for kind in ("acct", "repo", "label", "issue", "cmt")}
        self.accounts: dict[str, Account] = {}
        self.repos: dict[tuple[str, str], Repo] = {}
        self.open_issues: dict[int, Issue] = {}
        self.user = self._add_account(user)
        self.org = self._add_account(org, is_org=True)
        self.lane_bot = self._add_account(LANE_BOT)
        self.tokens: dict[str, Account] = {token: self.user}

    # ----- accounts and repos -------------------------------------------------------------
    def _next(self, kind: str) -> int:
        return next(self._ids[kind])

    def _add_account(self, login: str, *, is_org: bool = False) -> Account:
        account = Account(self._next("acct"), login, is_org)
        self.accounts[login.lower()] = account
        return account

    def login_for_token(self, token: str) -> str | None:
        """Return the login owning `token`, or None."""
        account = self.tokens.get(token)
        return account.login if account else None

    def user_json(self, login: str) -> JSON:
        """Return the User object of `login`."""
        with self.lock:
            return self._account(login).to_json()

    def _account(self, login: str) -> Account:
        account = self.accounts.get(login.lower())
        if account is None:
            raise NotFoundError()
        return account

    def create_repo(
        self, owner: str, name: str, *, description: str = "", private: bool = False,
        auto_init: bool = False, org_only: bool = False,
    ) -> JSON:
        """Create a repo owned by a user or org; 404 unknown owner, 422 bad name, 409 exists."""
        with self.lock:
            account = self._account(owner)
            if org_only and not account.is_org:
                raise NotFoundError()
            if not REPO_NAME.match(name) or name in (".", ".."):
                raise ForgeError(422, "[Name]: AlphaDashDot")
            key = (account.login.lower(), name.lower())
            if key in self.repos:
                raise ForgeError(409, "The repository with the same name already exists.")
            repo = Repo(self._next("repo"), account, name, description, private, not auto_init)
            self.repos[key] = repo
            return repo.to_json(self.base_url)

    def _repo(self, owner: str, name: str) -> Repo:
        repo = self.repos.get((owner.lower(), name.lower()))
        if repo is None:
            raise NotFoundError()
        return repo

    def get_repo(self, owner: str, name: str) -> JSON:
        """Return the Repository object; 404 if missing."""
        with self.lock:
            return self._repo(owner, name).to_json(self.base_url)

    # ----- labels -------------------------------------------------------------------------
    def _repo_api(self, repo: Repo) -> str:
        return f"{self.base_url}/api/v1/repos/{repo.full_name}"

    def _labels_json(self, repo: Repo, labels: Iterable[Label]) -> list[JSON]:
        api = self._repo_api(repo)
        return [label.to_json(api) for label in labels]

    def list_labels(
        self, owner: str, name: str, page: int | None = None, limit: int | None = None
    ) -> tuple[list[JSON], int]:
        """Repo labels by name; all of them unless `page` >= 1. Returns (page, total)."""
        with self.lock:
            repo = self._repo(owner, name)
            labels = sorted(repo.labels.values(), key=lambda lb: (lb.name, lb.id))
            if page is not None and page > 0:
                size = page_size(limit)
                labels = labels[(page - 1) * size : page * size]
            return self._labels_json(repo, labels), len(repo.labels)

    def create_label(
        self, owner: str, name: str, label: str, color: str, description: str = ""
    ) -> JSON:
        """Create a label (duplicate names allowed, like Gitea); 422 on a bad color."""
        with self.lock:
            repo = self._repo(owner, name)
            return self._labels_json(repo, [self._new_label(repo, label, color, description)])[0]

    def delete_label(self, owner: str, name: str, label_id: int) -> None:
        """Delete a repo label and take it off every issue (like Gitea); 404 if unknown."""
        with self.lock:
            repo = self._repo(owner, name)
            if repo.labels.pop(label_id, None) is None:
                raise NotFoundError()
            for issue in repo.issues.values():
                issue.labels.pop(label_id, None)

    def _new_label(self, repo: Repo, name: str, color: str, description: str = "") -> Label:
        if not name:
            raise ForgeError(422, "[Name]: Required")
        label = Label(self._next("label"), name, normalize_color(color), description)
        repo.labels[label.id] = label
        return label

    # ----- issues -------------------------------------------------------------------------
    def _issue(self, repo: Repo, number: int, *, quirk_500: bool = False) -> Issue:
        issue = repo.issues.get(number)
        if issue is None:
            if quirk_500:
                raise ForgeError(500, "GetRawIssueByIndex")
            raise NotFoundError()
        return issue

    def create_issue(
        self, owner: str, name: str, poster: str, title: str, *, body: str = "",
        labels: Iterable[int] = (), assignees: Iterable[str] = (), closed: bool = False,
    ) -> JSON:
        """Create an issue; unknown label ids are silently dropped (like Gitea)."""
        if not title.strip():
            raise ForgeError(422, "[Title]: Required")
        with self.lock:
            repo = self._repo(owner, name)
            people = [self._assignee(login) for login in assignees]
            now = time.time()
            repo.last_index += 1
            issue = Issue(self._next("issue"), repo.last_index, repo, self._account(poster),
                          title[:TITLE_MAX], body, now, now, assignees=people)
            issue.labels = {i: repo.labels[i] for i in labels if i in repo.labels}
            repo.issues[issue.number] = issue
            self.open_issues[issue.id] = issue
            if closed:
                self._set_closed(issue, True, now)
            return issue.to_json(self.base_url)

    def _assignee(self, login: str) -> Account:
        account = self.accounts.get(login.lower())
        if account is None or account.is_org:
            raise ForgeError(422, f"Assignee does not exist: [name: {login}]")
        return account

    def _set_closed(self, issue: Issue, closed: bool, now: float) -> None:
        if closed and issue.closed is None:
            issue.closed = now
            self.open_issues.pop(issue.id, None)
        elif not closed and issue.closed is not None:
            issue.closed = None
            self.open_issues[issue.id] = issue
        issue.updated = now

    def get_issue(self, owner: str, name: str, number: int) -> JSON:
        """Return one issue; 404 if missing."""
        with self.lock:
            return self._issue(self._repo(owner, name), number).to_json(self.base_url)

    def list_issues(self, owner: str, name: str, query: IssueQuery) -> tuple[list[JSON], int]:
        """Filter (state, labels AND, updated since/before) newest first; (page, total)."""
        with self.lock:
            repo = self._repo(owner, name)
            if query.pulls_only:
                return [], 0
            matches = list(self._matching(repo, query))
            start = (query.page - 1) * query.limit
            chosen = matches[start : start + query.limit]
            return [issue.to_json(self.base_url) for issue in chosen], len(matches)

    def _matching(self, repo: Repo, query: IssueQuery) -> Iterator[Issue]:
        wanted = {lb.id for lb in repo.labels.values() if lb.name in query.labels}
        state, since, before = query.state, query.since, query.before
        for issue in reversed(repo.issues.values()):
            if state != "all" and (issue.closed is None) != (state == "open"):
                continue
            if since is not None and int(issue.updated) < since:
                continue
            if before is not None and int(issue.updated) > before:
                continue
            if wanted and not wanted.issubset(issue.labels):
                continue
            yield issue

    def edit_issue(
        self, owner: str, name: str, number: int, *, title: str | None = None,
        body: str | None = None, state: str | None = None,
    ) -> JSON:
        """Edit title/body/state (empty title ignored like Gitea); 412 on an unknown state."""
        if state is not None and state not in ("open", "closed"):
            raise ForgeError(412, f"unknown state: {state}")
        with self.lock:
            issue = self._issue(self._repo(owner, name), number)
            if title:
                issue.title = title[:TITLE_MAX]
            if body is not None:
                issue.body = body
            now = time.time()
            issue.updated = now
            if state is not None:
                self._set_closed(issue, state == "closed", now)
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
        """Every issue of a repo in creation order."""
        with self.lock:
            repo = self._repo(owner, name)
            return [issue.to_json(self.base_url) for issue in repo.issues.values()]

    # ----- comments -----------------------------------------------------------------------
    def issue_comments(
        self, owner: str, name: str, number: int, since: int | None = None,
        before: int | None = None,
    ) -> list[JSON]:
        """All comments of an issue, oldest first; a missing issue gives 500 (Gitea quirk)."""
        with self.lock:
            issue = self._issue(self._repo(owner, name), number, quirk_500=True)
            chosen = _in_window(issue.comments, since, before)
            return [comment.to_json(self.base_url) for comment in chosen]

    def create_comment(self, owner: str, name: str, number: int, poster: str, body: str) -> JSON:
        """Add a comment and bump the issue; a missing issue gives 500 (Gitea quirk)."""
        if not body:
            raise ForgeError(422, "[Body]: Required")
        with self.lock:
            issue = self._issue(self._repo(owner, name), number, quirk_500=True)
            return self._add_comment(issue, self._account(poster), body).to_json(self.base_url)

    def _add_comment(self, issue: Issue, poster: Account, body: str) -> Comment:
        now = time.time()
        comment = Comment(self._next("cmt"), issue, poster, body, now, now)
        issue.comments.append(comment)
        issue.repo.comments[comment.id] = comment
        issue.updated = now
        return comment

    def repo_comments(
        self, owner: str, name: str, *, since: int | None = None, before: int | None = None,
        page: int | None = None, limit: int | None = None,
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
        self, owner: str, name: str, number: int, ids: Iterable[int] = (),
        names: Iterable[str] = (),
    ) -> list[JSON]:
        """Add repo labels by id and/or name (unknown ones ignored); returns all labels."""
        with self.lock:
            repo = self._repo(owner, name)
            issue = self._issue(repo, number)
            wanted, by_name = set(ids), set(names)
            for label in repo.labels.values():
                if label.id in wanted or label.name in by_name:
                    issue.labels[label.id] = label
            issue.updated = time.time()
            return self._labels_json(repo, issue.label_list())

    def finish_issue(
        self, owner: str, name: str, number: int, *, comment: str | None, labels: list[str],
        author: str = LANE_BOT,
    ) -> None:
        """Comment (if any), add labels by name (creating missing ones), then close."""
        with self.lock:
            issue = self._issue(self._repo(owner, name), number)
            self.finish(issue, comment=comment, labels=labels, author=author)

    def finish(
        self, issue: Issue, *, comment: str | None, labels: list[str], author: str = LANE_BOT
    ) -> None:
        """`finish_issue` on a record the caller already holds (call with the lock held)."""
        with self.lock:
            if comment:
                self._add_comment(issue, self._account(author), comment)
            for label_name in labels:
                found = [lb for lb in issue.repo.labels.values() if lb.name == label_name]
                found = found or [self._new_label(issue.repo, label_name, "00aa00")]
                issue.labels[found[0].id] = found[0]
            self._set_closed(issue, True, time.time())


def _in_window(
    comments: Iterable[Comment], since: int | None, before: int | None
) -> list[Comment]:
    """Comments whose whole-second `updated` lies in [since, before]."""
    return [
        c for c in comments
        if (since is None or int(c.updated) >= since)
        and (before is None or int(c.updated) <= before)
    ]
