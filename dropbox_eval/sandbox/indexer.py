"""What the sandbox's issue indexer holds of an issue: the issue as of a moment ago.

Gitea answers `/repos/issues/search` from its issue indexer, fed through a queue: the
filters (state, labels, `since`/`before` on `updated`) are matched against what the index
holds, then the matching issues are loaded from the database (`GetIssuesByIDs`), so the
body is current while the match is as of the last indexing. With an index lag of N
seconds the sandbox matches each issue as it stood N seconds ago, rebuilt from its
timeline: the state from its `close`/`reopen` entries, the labels from its `label`
entries, `updated` from its latest entry; an issue created since is not indexed yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import Event, Issue
from .timeline import entries


@dataclass(frozen=True)
class Indexed:
    """The fields of an issue that a search matches, as the index holds them."""

    is_pull: bool
    closed: float | None
    labels: frozenset[int]
    updated: float


def indexed(issue: Issue, horizon: float) -> Indexed | Issue | None:
    """`issue` as the index held it at `horizon`: the issue itself when unchanged since,
    None when created after it."""
    if issue.updated <= horizon:
        return issue
    if issue.created > horizon:
        return None
    closed: float | None = None
    labels: set[int] = set()
    updated = issue.created
    for entry in entries(issue):
        if entry.created > horizon:
            continue
        updated = max(updated, entry.created)
        if isinstance(entry, Event):
            closed, labels = _replay(entry, closed, labels)
    return Indexed(issue.is_pull, closed, frozenset(labels), updated)


def _replay(event: Event, closed: float | None, labels: set[int]) -> tuple[float | None, set[int]]:
    if event.kind == "close":
        return event.created, labels
    if event.kind == "reopen":
        return None, labels
    if event.kind == "label" and event.label is not None:
        if event.body:  # "1": added; empty: removed
            labels.add(event.label.id)
        else:
            labels.discard(event.label.id)
    return closed, labels
