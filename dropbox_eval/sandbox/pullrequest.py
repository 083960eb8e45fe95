"""Gitea's `PullRequest` object rendered from an issue that is a pull request."""

from __future__ import annotations

import hashlib

from .models import JSON, Issue, Repo, iso


def fake_sha(*parts: object) -> str:
    """A stable 40-hex commit id (there is no git in the sandbox)."""
    return hashlib.sha1(":".join(map(str, parts)).encode()).hexdigest()  # noqa: S324 - not security


def _branch(repo: Repo, ref: str, sha: str, base_url: str) -> JSON:
    return {
        "label": ref,
        "ref": ref.rsplit(":", 1)[-1],
        "sha": sha,
        "repo_id": repo.id,
        "repo": repo.to_json(base_url),
    }


def pull_json(issue: Issue, base_url: str) -> JSON:
    """Render a PR; `merge_commit_sha`, `merged_at` and `merged_by` stay null until merged."""
    pull = issue.pull
    assert pull is not None, "pull_json needs a pull request"
    html = issue.html_url(base_url)
    data = issue.to_json(base_url)
    base_sha = fake_sha(issue.repo.id, pull.base)
    merged = pull.merged is not None
    data.update(
        {
            "id": pull.id,
            "url": html,
            "requested_reviewers": [],
            "requested_reviewers_teams": [],
            "draft": False,
            "review_comments": 0,
            "additions": pull.additions,
            "deletions": pull.deletions,
            "changed_files": pull.changed_files,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "mergeable": issue.closed is None,
            "merged": merged,
            "merged_at": iso(pull.merged),
            "merge_commit_sha": pull.merge_sha,
            "merged_by": pull.merged_by.to_json() if pull.merged_by else None,
            "allow_maintainer_edit": False,
            "base": _branch(issue.repo, pull.base, base_sha, base_url),
            "head": _branch(issue.repo, pull.head, pull.head_sha, base_url),
            "merge_base": base_sha,
            "pin_order": 0,
        }
    )
    for key in ("ref", "original_author", "original_author_id", "repository", "pull_request"):
        data.pop(key, None)
    return data
