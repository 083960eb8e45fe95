"""Comments and the timeline of the sandbox forge's issues.

Editing a comment changes the comment only (Gitea's `UpdateComment`): the issue's
`updated_at` stays, so an issue listing with `since` does not show the edit; the comment's
own `updated_at` (in the timeline too) does. The timeline pages first and filters after
(Gitea's `ListIssueCommentsAndTimeline`: code review comments and cross-references from
repos the caller cannot read are dropped), so a short page is not always the last; it sends
no `Link` header and `X-Total-Count` counts the page.

Deleting a comment (Gitea's `DeleteIssueComment` and `issues_model.DeleteComment`) drops
its row: it leaves `/comments` and the timeline with no trace, the issue's `updated_at`
stays, and hooks get `issue_comment` with `deleted`. Any timeline row can be deleted so
(a label or close entry too), by its poster or by someone who may write the repo's issues.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import SandboxApiError, SandboxNotFound
from .models import JSON, Comment, Event
from .query import paged
from .state_pulls import PullsMixin
from .timeline import entries, entry_json, in_window


class CommentsMixin(PullsMixin):
    """Issue comments, their edits, and the timeline (mixed into `ForgeState`)."""

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
            raise SandboxApiError(422, "[Body]: Required")
        with self.lock:
            issue = self._issue(self._writable(owner, name), number, quirk=True)
            return self._add_comment(issue, self._account(poster), body).to_json(self.base_url)

    def edit_comment(self, owner: str, name: str, comment_id: int, doer: str, body: str) -> JSON:
        """Gitea's `EditIssueComment`: 404 when the comment is not this repo's, 422 without
        a body, 423 in an archived repo; the issue is not touched (`UpdateComment`)."""
        if not body:
            raise SandboxApiError(422, "[Body]: Required")
        with self.lock:
            repo = self._writable(owner, name)
            comment = repo.comments.get(comment_id)
            if comment is None:
                raise SandboxNotFound()
            old, comment.body, comment.updated = comment.body, body, self.now()
            changes = {"body": {"from": old}}
            self._notify_comment(comment, "edited", self._account(doer), changes)
            return comment.to_json(self.base_url)

    def delete_comment(self, owner: str, name: str, comment_id: int, doer: str) -> None:
        """Gitea's `deleteIssueComment`: SandboxNotFound for an unknown id, SandboxApiError 404
        without a body for another repo's, 403 without a body unless `doer` posted it or may
        write the repo; not guarded against archived repos (no `mustNotBeArchived`)."""
        with self.lock:
            repo = self._repo(owner, name)
            entry = self._timeline_row(comment_id)
            if entry is None:
                raise SandboxNotFound(f"comment does not exist [id: {comment_id}, issue_id: 0]")
            if entry.issue.repo is not repo:
                raise SandboxApiError(404, "", bare=True)
            actor = self._account(doer)
            if entry.user is not actor and not self.can_write(repo, actor.login):
                raise SandboxApiError(403, "", bare=True)
            if isinstance(entry, Event):
                entry.issue.events.remove(entry)
                return
            entry.issue.comments.remove(entry)
            repo.comments.pop(entry.id, None)
            self._notify_comment(entry, "deleted", actor)

    def _timeline_row(self, row_id: int) -> Comment | Event | None:
        """The comment or event `row_id` of any repo (Gitea's `GetCommentByID`)."""
        for repo in self.repos.values():
            if row_id in repo.comments:
                return repo.comments[row_id]
            for issue in repo.issues.values():
                for event in issue.events:
                    if event.id == row_id:
                        return event
        return None

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
        caller: str | None = None,
    ) -> list[JSON]:
        """Comments and events oldest first; all of them unless `page` >= 1 (like Gitea),
        then the entries `caller` may not see are dropped from the page."""
        with self.lock:
            issue = self._issue(self._repo(owner, name), number, quirk=True)
            chosen = paged(in_window(entries(issue), since, before), page, limit)
            login = caller or self.user.login
            seen = [e for e in chosen if not isinstance(e, Event) or self._visible(e, login)]
            return [entry_json(entry, self.base_url) for entry in seen]

    def _visible(self, event: Event, login: str) -> bool:
        """Gitea's `isXRefCommentAccessible`: a reference from another repo shows only to
        those who may read that repo."""
        source = event.ref_issue.repo if event.ref_issue is not None else None
        return source is None or source is event.issue.repo or self.can_read(source, login)

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
            chosen = paged(chosen, page, limit)
            return [comment.to_json(self.base_url) for comment in chosen], total


def _in_window(comments: Iterable[Comment], since: int | None, before: int | None) -> list[Comment]:
    """Comments whose whole-second `updated` lies in [since, before]."""
    return [
        c
        for c in comments
        if (since is None or int(c.updated) >= since)
        and (before is None or int(c.updated) <= before)
    ]
