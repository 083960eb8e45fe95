"""Pull requests of the sandbox forge: create, list, edit, merge, and issue references.

A PR is an issue with a `Pull` record (shared number space, like Gitea). `#N` and
`owner/name#N` references in its title and (Markdown-stripped) body add a `pull_ref` event
on the issue they name, in this repo or another (Gitea's `getCrossReferences`). Merging
resolves the latest reference to each issue: `Closes` closes it only while it is open and
`Reopens` reopens it only while it is closed, with a `close`/`reopen` event by the merger
carrying the merge commit; an issue closed by hand before the merge is left as it is, and
not touched at all (`services/pull/merge.go`, `handleCloseCrossReferences`).
"""

from __future__ import annotations

from .errors import SandboxApiError, SandboxNotFound
from .mdstrip import strip_markdown
from .models import JSON, Account, Event, Issue, Pull, Repo
from .pullrequest import fake_sha, pull_json
from .query import page_size
from .state_repos import ReposMixin
from .timeline import Reference, find_references

MERGE_STYLES = ("merge", "rebase", "rebase-merge", "squash", "fast-forward-only", "manually-merged")


class PullsMixin(ReposMixin):
    """Pull-request operations (mixed into `ForgeState`)."""

    def create_pull(
        self,
        owner: str,
        name: str,
        poster: str,
        *,
        head: str,
        base: str,
        title: str,
        body: str = "",
    ) -> JSON:
        """Open a PR; 422 without title/branches or with head == base, 409 if one is open."""
        if not title.strip():
            raise SandboxApiError(422, "[Title]: Required")
        if not head or not base:
            raise SandboxApiError(422, f"[{'Head' if not head else 'Base'}]: Required")
        if head == base:
            raise SandboxApiError(422, "Invalid PullRequestCompare: head and base are the same")
        with self.lock:
            repo = self._writable(owner, name)
            pr = self.open_pull(repo, self._account(poster), head, base, title, body)
            return pull_json(pr, self.base_url)

    def open_pull(
        self, repo: Repo, poster: Account, head: str, base: str, title: str, body: str
    ) -> Issue:
        """Record-level `create_pull` (lock held by the caller or taken here)."""
        with self.lock:
            if (head, base) in repo.open_heads:
                raise SandboxApiError(
                    409,
                    "pull request already exists for these targets "
                    f"[head_branch: {head}, base_branch: {base}]",
                )
            pull_id = self._next("pull")
            pull = Pull(
                pull_id,
                head,
                base,
                fake_sha(repo.id, head, pull_id),
                additions=3 + pull_id * 7 % 120,
                deletions=pull_id * 3 % 40,
                changed_files=1 + pull_id % 6,
            )
            pr = self._new_issue(repo, poster, title, body, pull)
            self._link_references(pr, poster)
            return pr

    def _link_references(self, pr: Issue, doer: Account) -> None:
        """A `pull_ref` event on each issue the PR's title and body mention (Gitea's
        `getCrossReferences`: the title as plain text, the body Markdown-stripped)."""
        assert pr.pull is not None
        refs = dict(find_references(pr.title))
        for ref, action in find_references(strip_markdown(pr.body)):
            if ref not in refs or action != "none":
                refs[ref] = action
        for ref, action in refs.items():
            target = self._referenced(pr.repo, ref)
            if target is None or target is pr:
                continue
            if target.is_pull:
                action = "none"  # close/reopen keywords only act on issues
            event = self._event(target, "pull_ref", doer, ref_issue=pr, ref_action=action)
            pr.pull.ref_events.append(event)

    def _referenced(self, repo: Repo, ref: Reference) -> Issue | None:
        """The issue a reference names: in `repo`, or in the repo `owner/name` names."""
        name, number = ref
        if name is not None:
            owner, _, repo_name = name.partition("/")
            found = self.repos.get((owner.lower(), repo_name.lower()))
            if found is None:
                return None
            repo = found
        return repo.issues.get(number)

    def _pull(self, owner: str, name: str, number: int) -> Issue:
        issue = self._issue(self._repo(owner, name), number)
        if issue.pull is None:
            raise SandboxNotFound()
        return issue

    def get_pull(self, owner: str, name: str, number: int) -> JSON:
        """One PR; 404 if missing or a plain issue."""
        with self.lock:
            return pull_json(self._pull(owner, name, number), self.base_url)

    def list_pulls(
        self,
        owner: str,
        name: str,
        *,
        state: str = "open",
        page: int = 1,
        limit: int | None = None,
    ) -> tuple[list[JSON], int, int]:
        """PRs newest first filtered by state; returns (page, total, page size)."""
        with self.lock:
            repo = self._repo(owner, name)
            pulls = [
                i
                for i in reversed(repo.issues.values())
                if i.pull is not None
                and (state == "all" or (i.closed is None) == (state != "closed"))
            ]
            size = page_size(limit)
            chosen = pulls[(page - 1) * size : page * size]
            return [pull_json(pr, self.base_url) for pr in chosen], len(pulls), size

    def edit_pull(
        self,
        owner: str,
        name: str,
        number: int,
        doer: str,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
    ) -> JSON:
        """Edit a PR (201); `state: closed` abandons it; 412 to change a merged PR's state."""
        with self.lock:
            pr = self._pull(owner, name, number)
            assert pr.pull is not None
            actor = self._account(doer)
            if state is not None:
                if pr.pull.merged is not None:
                    raise SandboxApiError(
                        412, "cannot change state of this pull request, it was already merged"
                    )
                self._set_closed(pr, state == "closed", actor)
            if title or body is not None:
                pr.title = self.flavor.cut_title(title) if title else pr.title
                pr.body = body if body is not None else pr.body
                self._neuter_references(pr)
                self._link_references(pr, actor)
            pr.updated = self.now()
            return pull_json(pr, self.base_url)

    def _neuter_references(self, pr: Issue) -> None:
        """Old references of an edited PR stop acting (Gitea marks them `neutered`; the
        row's `updated` moves, the referenced issue's does not)."""
        assert pr.pull is not None
        for event in pr.pull.ref_events:
            if event.ref_action != "neutered":
                event.ref_action, event.updated = "neutered", self.now()

    def merge_pull(self, owner: str, name: str, number: int, doer: str) -> None:
        """Merge: 405 (empty message) if already merged, 404 if closed or missing."""
        with self.lock:
            self._writable(owner, name)
            pr = self._pull(owner, name, number)
            assert pr.pull is not None
            if pr.pull.merged is not None:
                raise SandboxApiError(405, "")
            if pr.closed is not None:
                raise SandboxNotFound()
            self.merge(pr, self._account(doer))

    def is_merged(self, owner: str, name: str, number: int) -> bool:
        """Whether PR `number` is merged (404 if it is not a PR)."""
        with self.lock:
            pull = self._pull(owner, name, number).pull
            return pull is not None and pull.merged is not None

    def merge(self, pr: Issue, doer: Account) -> None:
        """Record-level merge: sha, merged_at/by, PR closed, referenced issues resolved
        (Gitea's `handleCloseCrossReferences`: only a change of state is made)."""
        with self.lock:
            pull = pr.pull
            assert pull is not None and pull.merged is None
            now = self.now()
            pull.merged, pull.merged_by = now, doer
            pull.merge_sha = fake_sha(pr.repo.id, pull.head_sha, now)
            self._set_state(pr, now)
            pr.updated = now
            self._event(pr, "merge_pull", doer, commit_sha=pull.merge_sha)
            self._notify(pr, "closed", doer)  # Gitea: action closed, pull_request.merged
            for event in _latest_per_issue(pull.ref_events):
                closes = event.ref_action == "closes"
                if closes == (event.issue.closed is None):
                    self._set_closed(event.issue, closes, doer, pull.merge_sha)


def _latest_per_issue(events: list[Event]) -> list[Event]:
    """The closing or reopening references of a PR, the latest per issue."""
    latest: dict[int, Event] = {}
    for event in events:
        if event.ref_action in ("closes", "reopens"):
            latest[event.issue.id] = event
    return list(latest.values())
