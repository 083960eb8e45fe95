"""Repos of the sandbox forge after creation: rename (old names redirect), archive, label
edits, and who may read a repo.

Gitea keeps a `repo_redirect` row when a repo is renamed (`repo_model.NewRedirect`): every
API request to the old `owner/name` is answered by `RedirectToRepo` with 307 Temporary
Redirect to the same path under the new name, whatever the method (very old releases
answered with the framework's default, 302: `redirect_status` picks it). An archived repo
refuses the writes Gitea guards with `mustNotBeArchived` (new issues, comments, comment
edits, new and merged pull requests) with 423.
"""

from __future__ import annotations

from .errors import ForgeError, NotFoundError
from .models import JSON, Label, Repo
from .query import normalize_color
from .state_base import StateBase


class ReposMixin(StateBase):
    """Repo edits, redirects and read access (mixed into `ForgeState`)."""

    redirect_status = 307  # RedirectToRepo's http.StatusTemporaryRedirect

    def edit_repo(
        self,
        owner: str,
        name: str,
        *,
        new_name: str | None = None,
        archived: bool | None = None,
        description: str | None = None,
    ) -> JSON:
        """Gitea's `EditRepo`: rename (the old name redirects), archive or unarchive;
        422 for a bad or taken name."""
        with self.lock:
            repo = self._repo(owner, name)
            if new_name and new_name != repo.name:
                self._rename(repo, new_name)
            if archived is not None:
                repo.archived = archived
            if description is not None:
                repo.description = description
            return repo.to_json(self.base_url)

    def _rename(self, repo: Repo, new_name: str) -> None:
        self.flavor.check_repo_name(new_name)
        owner = repo.owner.login.lower()
        new_key = (owner, new_name.lower())
        if new_key in self.repos and self.repos[new_key] is not repo:
            raise ForgeError(
                422, f"repository already exists [uname: {repo.owner.login}, name: {new_name}]"
            )
        old_key = (owner, repo.name.lower())
        del self.repos[old_key]
        repo.name = new_name
        self.repos[new_key] = repo
        self.moved.pop(new_key, None)
        self.moved[old_key] = repo

    def moved_to(self, owner: str, name: str) -> str | None:
        """The current `owner/name` of a repo that `owner/name` used to name (None when it
        names a repo, or nothing)."""
        with self.lock:
            key = (owner.lower(), name.lower())
            if key in self.repos:
                return None
            repo = self.moved.get(key)
            return repo.full_name if repo is not None else None

    def _writable(self, owner: str, name: str) -> Repo:
        """The repo for a write Gitea guards with `mustNotBeArchived` (423 when archived)."""
        repo = self._repo(owner, name)
        if repo.archived:
            raise ForgeError(423, self.flavor.archived_message(repo.id, repo.full_name))
        return repo

    def can_read(self, repo: Repo, login: str) -> bool:
        """Whether `login` may read `repo`: public, its own, or an org's (every user of
        the sandbox belongs to every org); a private repo of another user is hidden."""
        return not repo.private or repo.owner.is_org or repo.owner.login.lower() == login.lower()

    def repos_of(self, uid: int | None) -> list[JSON]:
        """The repos owned by account `uid` (every repo without one), oldest first."""
        with self.lock:
            chosen = self.repos.values() if uid is None else self.owned.get(uid, [])
            return [repo.to_json(self.base_url) for repo in chosen]

    def is_org(self, login: str) -> bool:
        """Whether `login` is an organization."""
        with self.lock:
            account = self.accounts.get(login.lower())
            return account is not None and account.is_org

    def edit_label(
        self,
        owner: str,
        name: str,
        label_id: int,
        *,
        new_name: str | None = None,
        color: str | None = None,
        description: str | None = None,
    ) -> JSON:
        """Gitea's `EditLabel`: 404 unknown, 422 bad color; issues keep the label (by id)."""
        with self.lock:
            repo = self._repo(owner, name)
            label = repo.labels.get(label_id)
            if label is None:
                raise NotFoundError()
            if color is not None:
                label.color = normalize_color(color)
            if new_name:
                self._rename_label(label, new_name)
            if description is not None:
                label.description = description
            return label.to_json(self._repo_api(repo))

    def _rename_label(self, label: Label, new_name: str) -> None:
        self.labels_named.get(label.name, set()).discard(label.id)
        label.name = new_name
        self.labels_named.setdefault(new_name, set()).add(label.id)
