"""Timeline events of an issue (close, reopen, label, pull_ref, merge_pull) and references.

Gitea stores every timeline entry as a comment row with a type; plain comments stay
`Comment` records and all other entries are `Event`s sharing the same id sequence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .models import JSON, Comment, Event, Issue, iso

CLOSE_WORDS = (
    "close",
    "closes",
    "closed",
    "fix",
    "fixes",
    "fixed",
    "resolve",
    "resolves",
    "resolved",
)
REOPEN_WORDS = ("reopen", "reopens", "reopened")
# Gitea's issueNumericPattern and crossReferenceIssueNumericPattern (modules/references),
# with look-arounds so neighbouring references both match.
_REF = re.compile(r"""(?:^|(?<=[\s(\['"]))[#!]([0-9]+)(?=\s|$|[)\]'"]|[:;,.?!](?:\s|$))""")
_XREF = re.compile(
    r"(?:^|(?<=[\s(\[]))([0-9a-zA-Z_.-]+/[0-9a-zA-Z_.-]+)[#!]([0-9]+)"
    r"(?=\s|$|[)\]]|[:;,.?!](?:\s|$))"
)
_CLOSE = re.compile(r"(?i)(?:\s|^|\(|\[)(" + "|".join(CLOSE_WORDS) + r"):? $")
_REOPEN = re.compile(r"(?i)(?:\s|^|\(|\[)(" + "|".join(REOPEN_WORDS) + r"):? $")
_NULL_FIELDS = (
    "assignee",
    "assignee_team",
    "dependent_issue",
    "milestone",
    "old_milestone",
    "ref_comment",
    "resolve_doer",
    "tracked_time",
)


Reference = tuple[str | None, int]  # (`owner/name` of another repo, or None; number)


def find_references(text: str) -> list[tuple[Reference, str]]:
    """`#N` and `owner/name#N` references in `text` with Gitea's action: `closes`,
    `reopens` or `none` (`FindAllIssueReferences`). Markdown must be stripped first for a
    body (`mdstrip.strip_markdown`), not for a title.

    A reference seen twice keeps its first position; a keyword on any mention wins.
    """
    found: dict[Reference, str] = {}
    hits: list[tuple[Reference, int]] = [
        ((None, int(m.group(1))), m.start()) for m in _REF.finditer(text)
    ]
    hits += [((m.group(1), int(m.group(2))), m.start()) for m in _XREF.finditer(text)]
    for ref, start in sorted(hits, key=lambda hit: hit[1]):
        before = text[:start]
        action = "none"
        if _CLOSE.search(before):
            action = "closes"
        elif _REOPEN.search(before):
            action = "reopens"
        if ref not in found or action != "none":
            found[ref] = action
    return list(found.items())


def entries(issue: Issue) -> list[Comment | Event]:
    """Comments and events of an issue, oldest first (Gitea: created, then id)."""
    merged: list[Comment | Event] = [*issue.comments, *issue.events]
    return sorted(merged, key=lambda e: (int(e.created), e.id))


def in_window(
    items: Iterable[Comment | Event], since: int | None, before: int | None
) -> list[Comment | Event]:
    """Entries whose whole-second update time lies in [since, before]."""
    chosen = []
    for item in items:
        stamp = int(item.updated)
        if (since is None or stamp >= since) and (before is None or stamp <= before):
            chosen.append(item)
    return chosen


def entry_json(entry: Comment | Event, base_url: str) -> JSON:
    """Render one entry as Gitea's `TimelineComment`."""
    issue = entry.issue
    html = issue.html_url(base_url)
    repo_api = f"{base_url}/api/v1/repos/{issue.repo.full_name}"
    data: JSON = {
        "id": entry.id,
        "type": "comment",
        "user": entry.user.to_json(),
        "html_url": f"{html}#issuecomment-{entry.id}",
        "issue_url": "" if issue.is_pull else html,
        "pull_request_url": html if issue.is_pull else "",
        "body": entry.body,
        "created_at": iso(entry.created),
        "updated_at": iso(entry.created),
        "old_project_id": 0,
        "project_id": 0,
        "old_title": "",
        "new_title": "",
        "old_ref": "",
        "new_ref": "",
        "ref_action": "none",
        "ref_commit_sha": "",
        "review_id": 0,
        "removed_assignee": False,
        "label": None,
        "ref_issue": None,
        **dict.fromkeys(_NULL_FIELDS),
    }
    data["updated_at"] = iso(entry.updated)
    if isinstance(entry, Comment):
        return data
    data.update(type=entry.kind, ref_action=entry.ref_action, ref_commit_sha=entry.commit_sha)
    if entry.label is not None:
        data["label"] = entry.label.to_json(repo_api)
    if entry.ref_issue is not None:
        data["ref_issue"] = entry.ref_issue.to_json(base_url)
    return data
