"""Repos of the sandbox forge after creation: rename and transfer (old paths redirect),
archive, label edits, and who may read or write a repo.

Gitea keeps a `repo_redirect` row when a repo is renamed (`repo_model.NewRedirect`): every
API request to the old `owner/name` is answered by `RedirectToRepo` with 307 Temporary
Redirect to the same path under the new name, whatever the method (very old releases
answered with the framework's default, 302: `redirect_status` picks it). An archived repo
refuses the writes Gitea guards with `mustNotBeArchived` (new issues, comments, comment
edits, new and merged pull requests) with 423.

A transfer (Gitea's `Transfer`, `reqOwner`) moves the repo to a new owner at once and
answers 202 with it, as Gitea does for an admin or a move into an org; the old
`owner/name` then redirects like a rename (`TransferOwnership` adds the same redirect row).
Gitea's pending transfer to another user (201, accepted later) is not modelled.
"""

from __future__ import annotations

from .errors import SandboxApiError, SandboxNotFound
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
            raise SandboxApiError(
                422, f"repository already exists [uname: {repo.owner.login}, name: {new_name}]"
            )
        old_key, old_name = (owner, repo.name.lower()), repo.full_name
        del self.repos[old_key]
        repo.name = new_name
        self.repos[new_key] = repo
        self._redirect(old_key, old_name, repo)

    def transfer_repo(self, owner: str, name: str, new_owner: str, doer: str) -> JSON:
        """Move a repo to `new_owner`: 403 unless `doer` owns it (or it is an org's),
        404 for an unknown new owner, 422 when the new owner has a repo of that name."""
        with self.lock:
            repo = self._repo(owner, name)
            if not self.can_write(repo, doer):
                raise SandboxApiError(403, "user should be the owner of the repo")
            target = self.accounts.get(new_owner.lower())
            if target is None:
                raise SandboxApiError(404, "The new owner does not exist or cannot be found")
            new_key = (target.login.lower(), repo.name.lower())
            if new_key in self.repos and self.repos[new_key] is not repo:
                raise SandboxApiError(
                    422, f"repository already exists [uname: {target.login}, name: {repo.name}]"
                )
            old_key, old_name = (repo.owner.login.lower(), repo.name.lower()), repo.full_name
            del self.repos[old_key]
            self.owned[repo.owner.id].remove(repo)
            repo.owner = target
            self.repos[new_key] = repo
            self.owned.setdefault(target.id, []).append(repo)
            self._redirect(old_key, old_name, repo)
            return repo.to_json(self.base_url)

    def _redirect(self, old_key: tuple[str, str], old_name: str, repo: Repo) -> None:
        """The old path of a moved repo redirects to it; its hooks go with it."""
        self.moved.pop((repo.owner.login.lower(), repo.name.lower()), None)
        self.moved[old_key] = repo
        self.hooks.rescope(f"repo:{old_name}", f"repo:{repo.full_name}")

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
            raise SandboxApiError(423, self.flavor.archived_message(repo.id, repo.full_name))
        return repo

    def can_read(self, repo: Repo, login: str) -> bool:
        """Whether `login` may read `repo`: public, its own, or an org's (every user of
        the sandbox belongs to every org); a private repo of another user is hidden."""
        return not repo.private or repo.owner.is_org or repo.owner.login.lower() == login.lower()

    def can_write(self, repo: Repo, login: str) -> bool:
        """Whether `login` may write `repo` (its issues, or the repo as its owner): its
        own, or an org's (every user of the sandbox belongs to every org)."""
        return repo.owner.is_org or repo.owner.login.lower() == login.lower()

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
                raise SandboxNotFound()
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
