"""In-memory records of the sandbox forge and their Gitea-shaped JSON renderings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


def iso(ts: float | None) -> str | None:
    """Format a unix time as RFC3339 UTC with second precision (like Gitea)."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(ts)))


@dataclass(eq=False)
class Account:
    """A user or an organization."""

    id: int
    login: str
    is_org: bool = False

    def to_json(self) -> JSON:
        """Render as Gitea's User object (subset)."""
        return {
            "id": self.id,
            "login": self.login,
            "login_name": "",
            "full_name": self.login.title(),
            "email": f"{self.login}@sandbox.invalid",
            "avatar_url": "",
            "is_admin": False,
            "username": self.login,
        }


@dataclass(eq=False)
class Label:
    """A repository label; `color` is six lower-case hex digits without '#'."""

    id: int
    name: str
    color: str
    description: str = ""

    def to_json(self, repo_api: str) -> JSON:
        """Render as Gitea's Label object."""
        return {
            "id": self.id,
            "name": self.name,
            "exclusive": False,
            "is_archived": False,
            "color": self.color,
            "description": self.description,
            "url": f"{repo_api}/labels/{self.id}",
        }


@dataclass(eq=False)
class Repo:
    """A repository with its labels, issues (by number, creation order) and comments."""

    id: int
    owner: Account
    name: str
    description: str = ""
    private: bool = False
    empty: bool = True
    labels: dict[int, Label] = field(default_factory=dict)
    issues: dict[int, Issue] = field(default_factory=dict)
    comments: dict[int, Comment] = field(default_factory=dict)
    last_index: int = 0
    archived: bool = False
    # kept on every open/close like Gitea's num_issues/num_closed_issues columns, so a
    # change never counts the repo's issues (a webhook payload carries these counts)
    open_issues: int = 0
    open_pulls: int = 0
    open_heads: dict[tuple[str, str], int] = field(default_factory=dict)  # open PRs by branches

    @property
    def full_name(self) -> str:
        """`owner/name`."""
        return f"{self.owner.login}/{self.name}"

    def to_json(self, base_url: str) -> JSON:
        """Render as Gitea's Repository object (subset)."""
        return {
            "id": self.id,
            "name": self.name,
            "full_name": self.full_name,
            "owner": self.owner.to_json(),
            "description": self.description,
            "html_url": f"{base_url}/{self.full_name}",
            "clone_url": f"{base_url}/{self.full_name}.git",
            "private": self.private,
            "empty": self.empty,
            "archived": self.archived,
            "default_branch": "main",
            "has_issues": True,
            "open_issues_count": self.open_issues,
            "open_pr_counter": self.open_pulls,
        }


@dataclass(eq=False)
class Comment:
    """A plain conversation comment on an issue."""

    id: int
    issue: Issue
    user: Account
    body: str
    created: float
    updated: float

    def to_json(self, base_url: str) -> JSON:
        """Render as Gitea's Comment object."""
        issue_html = self.issue.html_url(base_url)
        pull = self.issue.is_pull
        return {
            "id": self.id,
            "html_url": f"{issue_html}#issuecomment-{self.id}",
            "issue_url": "" if pull else issue_html,
            "pull_request_url": issue_html if pull else "",
            "body": self.body,
            "user": self.user.to_json(),
            "original_author": "",
            "original_author_id": 0,
            "assets": [],
            "created_at": iso(self.created),
            "updated_at": iso(self.updated),
        }


@dataclass(eq=False)
class Pull:
    """The pull-request side of an issue that is a PR (no git here: branches are names)."""

    id: int
    head: str
    base: str
    head_sha: str
    additions: int = 0
    deletions: int = 0
    changed_files: int = 0
    merged: float | None = None
    merge_sha: str | None = None
    merged_by: Account | None = None
    ref_events: list[Event] = field(default_factory=list)  # its `pull_ref`s on other issues


@dataclass(eq=False)
class Issue:
    """An issue or a PR (`pull` set); `closed` is the close time or None while open."""

    id: int
    number: int
    repo: Repo
    poster: Account
    title: str
    body: str
    created: float
    updated: float
    closed: float | None = None
    labels: dict[int, Label] = field(default_factory=dict)
    assignees: list[Account] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    pull: Pull | None = None

    @property
    def is_pull(self) -> bool:
        """True for a pull request."""
        return self.pull is not None

    def html_url(self, base_url: str) -> str:
        """Web URL of the issue (`/pulls/N` for a PR, like Gitea)."""
        kind = "pulls" if self.pull is not None else "issues"
        return f"{base_url}/{self.repo.full_name}/{kind}/{self.number}"

    def pull_meta(self, base_url: str) -> JSON | None:
        """Gitea's `PullRequestMeta` for a PR, None for a plain issue."""
        if self.pull is None:
            return None
        return {
            "merged": self.pull.merged is not None,
            "merged_at": iso(self.pull.merged),
            "draft": False,
            "html_url": self.html_url(base_url),
        }

    def label_list(self) -> list[Label]:
        """Labels on the issue ordered by name then id (like Gitea)."""
        return sorted(self.labels.values(), key=lambda lb: (lb.name, lb.id))

    def to_json(self, base_url: str) -> JSON:
        """Render as Gitea's Issue object."""
        repo = self.repo
        repo_api = f"{base_url}/api/v1/repos/{repo.full_name}"
        assignees = [a.to_json() for a in self.assignees] or None
        return {
            "id": self.id,
            "url": f"{repo_api}/issues/{self.number}",
            "html_url": self.html_url(base_url),
            "number": self.number,
            "user": self.poster.to_json(),
            "original_author": "",
            "original_author_id": 0,
            "title": self.title,
            "body": self.body,
            "ref": "",
            "labels": [lb.to_json(repo_api) for lb in self.label_list()],
            "milestone": None,
            "assignee": assignees[0] if assignees else None,
            "assignees": assignees,
            "state": "open" if self.closed is None else "closed",
            "is_locked": False,
            "comments": len(self.comments),
            "created_at": iso(self.created),
            "updated_at": iso(self.updated),
            "closed_at": iso(self.closed),
            "due_date": None,
            "pull_request": self.pull_meta(base_url),
            "repository": {
                "id": repo.id,
                "name": repo.name,
                "owner": repo.owner.login,
                "full_name": repo.full_name,
            },
        }


@dataclass(eq=False)
class Event:
    """A non-comment timeline entry; `ref_issue` is the referencing PR for `pull_ref`.
    `updated` moves when the row changes (a neutered reference), like xorm's `updated`."""

    id: int
    issue: Issue
    kind: str
    user: Account
    created: float
    body: str = ""
    label: Label | None = None
    ref_issue: Issue | None = None
    ref_action: str = "none"
    commit_sha: str = ""
    updated: float = 0.0

    def __post_init__(self) -> None:
        self.updated = self.updated or self.created
