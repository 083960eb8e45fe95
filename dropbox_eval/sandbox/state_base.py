"""Core of the sandbox forge's in-memory data: accounts, repos, labels and record helpers.

Private `_` helpers expect `self.lock` held; public methods take it themselves.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable

from .clock import Clock
from .errors import SandboxApiError, SandboxNotFound
from .faults import Faults, RequestLog
from .flavor import Flavor
from .hooks import HookRegistry, comment_payload, issue_payload
from .models import JSON, Account, Comment, Event, Issue, Label, Pull, Repo
from .query import normalize_color, paged

LANE_BOT = "lane-bot"
HUMAN = "alice"  # a person of the forge besides the service's user and the lane


class StateBase:
    """Users/orgs, repos and labels, plus the helpers issues and pulls share."""

    def __init__(
        self,
        *,
        token: str = "sandbox-token",
        user: str = "eval",
        org: str = "evalorg",
        base_url: str = "http://127.0.0.1",
        flavor: Flavor | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.clock: Clock = clock or time.time
        self.base_url = base_url
        self.flavor = flavor or Flavor()
        self.faults = Faults()
        self.hooks = HookRegistry()
        self.indexer_lag = 0.0  # seconds before a change shows in /repos/issues/search
        self.log = RequestLog()
        self._ids = {
            kind: itertools.count(1) for kind in ("acct", "repo", "label", "issue", "cmt", "pull")
        }
        self.accounts: dict[str, Account] = {}
        self.repos: dict[tuple[str, str], Repo] = {}
        self.owned: dict[int, list[Repo]] = {}  # account id -> its repos, oldest first
        self.moved: dict[tuple[str, str], Repo] = {}  # an old (owner, name) -> renamed repo
        self.labels_named: dict[str, set[int]] = {}  # label name -> ids, every repo
        self.open_issues: dict[int, Issue] = {}
        self.user = self._add_account(user)
        self.org = self._add_account(org, is_org=True)
        self.lane_bot = self._add_account(LANE_BOT)
        self.tokens: dict[str, Account] = {token: self.user}
        self.tokens[f"{LANE_BOT}-token"] = self.lane_bot
        self.tokens[f"{HUMAN}-token"] = self._add_account(HUMAN)

    def now(self) -> float:
        """The forge's time (seconds since the epoch)."""
        return self.clock()

    # ----- accounts and repos -------------------------------------------------------------
    def _next(self, kind: str) -> int:
        return next(self._ids[kind])

    def _add_account(self, login: str, *, is_org: bool = False) -> Account:
        account = Account(self._next("acct"), login, is_org)
        self.accounts[login.lower()] = account
        return account

    def add_user(self, login: str, token: str | None = None) -> None:
        """Another user of the forge (a human commenting, say), with `token` if given."""
        with self.lock:
            account = self.accounts.get(login.lower()) or self._add_account(login)
            if token:
                self.tokens[token] = account

    def users(self) -> dict[str, str]:
        """Each user's login -> token (the first token of each), in creation order."""
        with self.lock:
            found: dict[str, str] = {}
            for token, account in self.tokens.items():
                found.setdefault(account.login, token)
            return found

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
            raise SandboxNotFound()
        return account

    def create_repo(
        self,
        owner: str,
        name: str,
        *,
        description: str = "",
        private: bool = False,
        auto_init: bool = False,
        org_only: bool = False,
    ) -> JSON:
        """Create a repo; 404 unknown owner, 422 bad name, 409 exists, 413 over quota."""
        with self.lock:
            account = self._account(owner)
            if org_only and not account.is_org:
                raise SandboxNotFound()
            self.flavor.check_repo_name(name)
            key = (account.login.lower(), name.lower())
            if key in self.repos:
                raise SandboxApiError(409, "The repository with the same name already exists.")
            owned = self.owned.setdefault(account.id, [])
            self.flavor.check_quota(account.id, account.login, len(owned))
            repo = Repo(self._next("repo"), account, name, description, private, not auto_init)
            self.repos[key] = repo
            owned.append(repo)
            self.moved.pop(key, None)  # Gitea's DeleteRedirect: the new repo takes the name
            return repo.to_json(self.base_url)

    def _repo(self, owner: str, name: str) -> Repo:
        repo = self.repos.get((owner.lower(), name.lower()))
        if repo is None:
            raise SandboxNotFound()
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
            return self._labels_json(repo, paged(labels, page, limit)), len(repo.labels)

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
            label = repo.labels.pop(label_id, None)
            if label is None:
                raise SandboxNotFound()
            self.labels_named.get(label.name, set()).discard(label_id)
            for issue in repo.issues.values():
                issue.labels.pop(label_id, None)

    def _new_label(self, repo: Repo, name: str, color: str, description: str = "") -> Label:
        if not name:
            raise SandboxApiError(422, "[Name]: Required")
        label = Label(self._next("label"), name, normalize_color(color), description)
        repo.labels[label.id] = label
        self.labels_named.setdefault(name, set()).add(label.id)
        return label

    # ----- record helpers (lock held) -----------------------------------------------------
    def _issue(self, repo: Repo, number: int, *, quirk: bool = False) -> Issue:
        """The issue or PR `number`; missing -> 404, or the flavour's status if `quirk`."""
        issue = repo.issues.get(number)
        if issue is None:
            if quirk and self.flavor.missing_issue_status == 500:
                raise SandboxApiError(500, "GetRawIssueByIndex")
            raise SandboxNotFound()
        return issue

    def _new_issue(
        self, repo: Repo, poster: Account, title: str, body: str, pull: Pull | None = None
    ) -> Issue:
        """A new open issue (or PR) taking the repo's next number."""
        now = self.now()
        repo.last_index += 1
        issue = Issue(
            self._next("issue"),
            repo.last_index,
            repo,
            poster,
            self.flavor.cut_title(title),
            body,
            now,
            now,
            pull=pull,
        )
        repo.issues[issue.number] = issue
        self._set_state(issue, None)
        self._notify(issue, "opened", poster)
        return issue

    def _set_state(self, issue: Issue, closed: float | None) -> None:
        """Open (`closed` None) or close a record, keeping the open lists and counts."""
        was_open, issue.closed = issue.closed is None and issue.id in self.open_issues, closed
        repo, delta = issue.repo, (closed is None) - was_open
        if closed is None:
            self.open_issues[issue.id] = issue
        else:
            self.open_issues.pop(issue.id, None)
        if issue.pull is None:
            repo.open_issues += delta
            return
        repo.open_pulls += delta
        heads = (issue.pull.head, issue.pull.base)
        if closed is None:
            repo.open_heads[heads] = issue.number
        elif repo.open_heads.get(heads) == issue.number:
            del repo.open_heads[heads]

    def _notify(self, issue: Issue, action: str, sender: Account, event_type: str = "") -> None:
        """Queue the webhook deliveries of a change (issues, issue_label, pull_request); the
        payload is built only when a hook wants the event."""
        kind = event_type or ("pull_request" if issue.is_pull else "issues")
        base = self.base_url
        self.hooks.notify(kind, issue.repo, lambda: issue_payload(action, issue, sender, base))

    def _event(
        self,
        issue: Issue,
        kind: str,
        user: Account,
        *,
        body: str = "",
        label: Label | None = None,
        ref_issue: Issue | None = None,
        ref_action: str = "none",
        commit_sha: str = "",
    ) -> Event:
        """Append a timeline event and bump the issue (every Gitea comment row does)."""
        now = self.now()
        event = Event(
            self._next("cmt"),
            issue,
            kind,
            user,
            now,
            body=body,
            label=label,
            ref_issue=ref_issue,
            ref_action=ref_action,
            commit_sha=commit_sha,
        )
        issue.events.append(event)
        issue.updated = now
        return event

    def _set_closed(self, issue: Issue, closed: bool, doer: Account, commit_sha: str = "") -> None:
        """Close or reopen with a `close`/`reopen` event; no-op if already in that state.
        `commit_sha`: the commit that did it (a merge), kept as the event's `ref_commit_sha`
        (Gitea's `ChangeStatus(ctx, issue, doer, commitID, closed)`)."""
        if closed and issue.closed is None:
            self._set_state(issue, self.now())
            self._event(issue, "close", doer, commit_sha=commit_sha)
            self._notify(issue, "closed", doer)
        elif not closed and issue.closed is not None:
            self._set_state(issue, None)
            self._event(issue, "reopen", doer, commit_sha=commit_sha)
            self._notify(issue, "reopened", doer)

    def _add_comment(self, issue: Issue, poster: Account, body: str) -> Comment:
        now = self.now()
        comment = Comment(self._next("cmt"), issue, poster, body, now, now)
        issue.comments.append(comment)
        issue.repo.comments[comment.id] = comment
        issue.updated = now
        self._notify_comment(comment, "created", poster)
        return comment

    def _notify_comment(
        self, comment: Comment, action: str, sender: Account, changes: JSON | None = None
    ) -> None:
        issue, base = comment.issue, self.base_url

        def payload() -> JSON:
            made = comment_payload(issue, comment.to_json(base), sender, base, action)
            return {**made, "changes": changes}

        self.hooks.notify("issue_comment", issue.repo, payload)

    def _add_labels(self, issue: Issue, labels: Iterable[Label], doer: Account) -> None:
        """Put labels on an issue, with a `label` event (body "1") per newly added one."""
        added = False
        for label in labels:
            if label.id not in issue.labels:
                issue.labels[label.id] = label
                self._event(issue, "label", doer, body="1", label=label)
                added = True
        issue.updated = self.now()
        if added:
            kind = "pull_request_label" if issue.is_pull else "issue_label"
            self._notify(issue, "label_updated", doer, kind)

    def _labels_named(self, repo: Repo, names: Iterable[str]) -> list[Label]:
        """First repo label of each name, creating missing ones (green, like the lane)."""
        chosen = []
        for name in names:
            found = [lb for lb in repo.labels.values() if lb.name == name]
            chosen.append(found[0] if found else self._new_label(repo, name, "00aa00"))
        return chosen
