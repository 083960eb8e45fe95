"""Thread-safe in-memory data of the sandbox forge (pure Python, no HTTP).

Every public method takes `self.lock` and returns Gitea-shaped JSON dicts, so callers
never see records while another thread mutates them. Accounts, repos and labels live in
`state_base`, repo edits in `state_repos`, pull requests in `state_pulls`, comments and
the timeline in `state_comments`; this module holds issues, their labels and the searches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .errors import SandboxApiError
from .indexer import indexed
from .models import JSON, Account, Issue, Repo
from .query import IssueQuery
from .state_base import LANE_BOT
from .state_comments import CommentsMixin

__all__ = ["LANE_BOT", "ForgeState"]


class ForgeState(CommentsMixin):
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
            raise SandboxApiError(422, "[Title]: Required")
        with self.lock:
            repo = self._writable(owner, name)
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
            raise SandboxApiError(422, f"Assignee does not exist: [name: {login}]")
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
        """Gitea's `SearchIssues`: issues across the repos of `owner` (400 when unknown),
        newest first; `labels` resolved to the ids of every label of that name in the whole
        instance (`GetLabelIDsByNames`) and ORed, no filter when none exists; matched as
        the indexer held them `indexer_lag` seconds ago (see `indexer`)."""
        with self.lock:
            repos = self._searched_repos(owner)
            horizon = self.now() - self.indexer_lag if self.indexer_lag > 0 else None
            ids = self.label_ids_named(query.labels)
            found = [
                issue
                for repo in repos
                for issue in self._matching(repo, query, label_ids=ids, horizon=horizon)
            ]
            found.sort(key=lambda issue: (issue.created, issue.id), reverse=True)
            start = (query.page - 1) * query.limit
            chosen = found[start : start + query.limit]
            return [issue.to_json(self.base_url) for issue in chosen], len(found)

    def _searched_repos(self, owner: str | None) -> Iterable[Repo]:
        if owner is None:
            return list(self.repos.values())
        account = self.accounts.get(owner.lower())
        if account is None:  # SearchIssues: ctx.Error(400, "Owner not found", err)
            raise SandboxApiError(400, f"user does not exist [uid: 0, name: {owner}]")
        return self.owned.get(account.id, [])

    def label_ids_named(self, names: Iterable[str]) -> set[int]:
        """Every label id of the instance carrying one of `names` (`GetLabelIDsByNames`):
        what Gitea sends the issue indexer for a search's `labels`."""
        with self.lock:
            return {label_id for name in names for label_id in self.labels_named.get(name, ())}

    def _matching(
        self,
        repo: Repo,
        query: IssueQuery,
        *,
        label_ids: set[int] | None = None,
        horizon: float | None = None,
    ) -> Iterator[Issue]:
        """The repo's issues a list (labels ANDed, this repo's own) or a search (`label_ids`
        ORed) matches, newest first; with `horizon`, matched as indexed then."""
        any_label = label_ids is not None
        wanted = (
            label_ids
            if label_ids is not None
            else {lb.id for lb in repo.labels.values() if lb.name in query.labels}
        )
        state, since, before = query.state, query.since, query.before
        for current in reversed(repo.issues.values()):
            issue = current if horizon is None else indexed(current, horizon)
            if issue is None:
                continue
            if (query.pulls_only and not issue.is_pull) or (query.issues_only and issue.is_pull):
                continue
            if state != "all" and (issue.closed is None) != (state == "open"):
                continue
            if since is not None and int(issue.updated) < since:
                continue
            if before is not None and int(issue.updated) > before:
                continue
            if wanted and not (
                not wanted.isdisjoint(issue.labels) if any_label else wanted.issubset(issue.labels)
            ):
                continue
            yield current

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
            raise SandboxApiError(412, f"unknown state: {state}")
        with self.lock:
            issue = self._issue(self._repo(owner, name), number)
            if state is not None and issue.pull is not None and issue.pull.merged is not None:
                raise SandboxApiError(
                    412, "cannot change state of this pull request, it was already merged"
                )
            if title:
                issue.title = self.flavor.cut_title(title)
            if body is not None:
                issue.body = body
            issue.updated = self.now()
            if state is not None:
                actor = self._account(doer) if doer else self.user
                self._set_closed(issue, state == "closed", actor)
            return issue.to_json(self.base_url)

    def delete_issue(self, owner: str, name: str, number: int) -> None:
        """Delete an issue and its comments; numbers are never reused."""
        with self.lock:
            repo = self._repo(owner, name)
            issue = self._issue(repo, number)
            if issue.closed is None:
                self._set_state(issue, self.now())
            del repo.issues[number]
            for comment in issue.comments:
                repo.comments.pop(comment.id, None)

    def all_issues(self, owner: str, name: str) -> list[JSON]:
        """Every issue and PR of a repo in creation order."""
        with self.lock:
            repo = self._repo(owner, name)
            return [issue.to_json(self.base_url) for issue in repo.issues.values()]

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

    def remove_issue_label(
        self, owner: str, name: str, number: int, label_id: int, doer: str | None = None
    ) -> None:
        """Gitea's `DeleteIssueLabel`: 422 for an unknown label id; a label the issue does
        not carry is no change; else a `label` event with an empty body (removed)."""
        with self.lock:
            repo = self._repo(owner, name)
            issue = self._issue(repo, number)
            if label_id not in repo.labels:
                raise SandboxApiError(422, f"label does not exist [id: {label_id}]")
            label = issue.labels.pop(label_id, None)
            if label is None:
                return
            actor = self._account(doer) if doer else self.user
            self._event(issue, "label", actor, body="", label=label)
            kind = "pull_request_label" if issue.is_pull else "issue_label"
            self._notify(issue, "label_cleared", actor, kind)

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
