"""Links to the forge: a batch's repo, each task's issue and pull request, built from the
forge's base URL (SAAS_EVAL_GITEA_URL) and the repo on the record, never from an address
a forge answer carried."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote


def repo_link(base_url: str | None, repo: str | None) -> str | None:
    """`<base>/<owner>/<name>`; None without a forge URL or a repo of that shape."""
    if not base_url or not repo or repo.count("/") != 1:
        return None
    owner, name = repo.split("/")
    return f"{base_url.rstrip('/')}/{quote(owner, safe='')}/{quote(name, safe='')}"


def with_forge_links(view: dict[str, Any], base_url: str | None) -> dict[str, Any]:
    """A batch view (views.batch) with `repo_url`, and each task with `issue_link` and
    `pull_link` (None where there is no issue, pull request or forge URL)."""
    repo = repo_link(base_url, view.get("repo"))
    tasks = [_task_links(task, base_url, view.get("repo")) for task in view.get("tasks", [])]
    return view | {"repo_url": repo, "tasks": tasks}


def _task_links(task: dict[str, Any], base_url: str | None, repo: str | None) -> dict[str, Any]:
    home = repo_link(base_url, repo)
    number = task.get("issue_number")
    issue = f"{home}/issues/{int(number)}" if home and number else None
    pull = task.get("pull_request") or {}
    pull_home = repo_link(base_url, pull.get("repo") or repo)
    pull_link = f"{pull_home}/pulls/{int(pull['number'])}" if pull_home and pull else None
    return task | {"issue_link": issue, "pull_link": pull_link}
