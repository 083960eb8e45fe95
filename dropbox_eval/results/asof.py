"""An issue's history as of its settle moment (README "Why settle").

The settle moment is the first instant at which the issue is closed and nothing about it
changed for the settle time: its last change so far plus the settle time. The result is
what the timeline says was true then; what happened after it (a reopen, a label, a comment,
a merge) is cut off, whenever the service reads. The timeline holds the label adds and
removals, closes and reopens, comments with their `created_at` and pull-request
references; a comment's body edited later cannot be rebuilt (Gitea keeps no edit history
in its API), so it is read as it is now and the result says so
(`summary_edited_after_settle`). A deleted comment is gone from the history altogether.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from ..forge.wire import ForgeIssue, ForgeRefIssue, ForgeTimelineEntry


class AsOf(NamedTuple):
    """The issue and its timeline as they stood once its last change before settling
    (`last`) was made."""

    issue: ForgeIssue
    timeline: list[ForgeTimelineEntry]
    last: datetime


def change_times(issue: ForgeIssue, timeline: list[ForgeTimelineEntry]) -> list[datetime]:
    """Every instant something about the issue changed that the forge shows, oldest first:
    its entries, their edits, and the issue's own `updated_at` (a change without an entry,
    such as an edit of its body)."""
    moments = {issue.updated_at}
    for entry in timeline:
        moments.add(entry.created_at)
        if entry.updated_at is not None and entry.updated_at > entry.created_at:
            moments.add(entry.updated_at)
    if issue.closed_at is not None:
        moments.add(issue.closed_at)
    return sorted(moments)


def settled_change(
    issue: ForgeIssue, timeline: list[ForgeTimelineEntry], settle: timedelta, now: datetime
) -> datetime | None:
    """The last change before the issue settled: the first instant after which it was
    closed and nothing changed for `settle` (the settle moment is this plus `settle`), by
    `now`; None while it has not settled (open, or changed too lately). A change at the
    settle moment itself comes after it."""
    times = change_times(issue, timeline)
    for index, moment in enumerate(times):
        if not _closed_after(issue, timeline, moment):
            continue
        later = times[index + 1] if index + 1 < len(times) else now
        if later >= moment + settle:
            return moment
    return None


def _closed_after(issue: ForgeIssue, timeline: list[ForgeTimelineEntry], moment: datetime) -> bool:
    """Whether the issue was closed once every change up to `moment` was made."""
    turns = [e for e in timeline if e.type in ("close", "reopen") and e.created_at <= moment]
    if turns:
        return turns[-1].type == "close"
    # no close or reopen entry (a forge that keeps none): the issue as it is now decides
    closed_at = issue.closed_at or issue.updated_at
    return issue.state == "closed" and closed_at <= moment


def as_of(
    issue: ForgeIssue, timeline: list[ForgeTimelineEntry], last: datetime, settle: timedelta
) -> AsOf:
    """The issue and timeline as they stood at the settle moment (`last` change plus
    `settle`): later entries are left out, the labels are the current ones with every later
    add or removal undone, and a pull request merged from that moment on is not merged (a
    merge is no change of the issue unless it closes it, so one within the settle time
    counts without moving it)."""
    before = [_unmerged_after(e, last, settle) for e in timeline if e.created_at <= last]
    labels = list(issue.labels)
    for entry in reversed([e for e in timeline if e.created_at > last]):
        if entry.type != "label" or entry.label is None or not entry.label.name:
            continue
        name = entry.label.name
        if entry.body == "1" and name in labels:  # added later: it was not there
            labels.remove(name)
        elif entry.body != "1" and name not in labels:  # removed later: it was there
            labels.append(name)
    closes = [e.created_at for e in before if e.type == "close"]
    then = issue.model_copy(
        update={
            "state": "closed",
            "labels": sorted(labels),  # the forge lists an issue's labels by name
            "closed_at": closes[-1] if closes else issue.closed_at,
        }
    )
    return AsOf(then, before, last)


def _unmerged_after(
    entry: ForgeTimelineEntry, last: datetime, settle: timedelta
) -> ForgeTimelineEntry:
    """A pull-request reference as it stood at the settle moment: a merge from then on
    undone (one made with the last change, or within the settle time, stands)."""
    ref = entry.ref_issue
    pull = ref.pull_request if ref is not None else None
    if ref is None or pull is None or pull.merged_at is None:
        return entry
    if pull.merged_at <= last or pull.merged_at < last + settle:
        return entry
    unmerged = pull.model_copy(update={"merged": False, "merged_at": None})
    then: ForgeRefIssue = ref.model_copy(update={"pull_request": unmerged, "state": "open"})
    return entry.model_copy(update={"ref_issue": then})


def edited_after(entry: ForgeTimelineEntry, last: datetime) -> bool:
    """Whether a comment was edited after `last` (its body then is unknown)."""
    return entry.updated_at is not None and entry.updated_at > max(entry.created_at, last)
