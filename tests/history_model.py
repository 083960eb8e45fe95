"""The oracle of tests/test_result_property.py: what one generated issue history means by
the settle contract (docs/client/results.md, "What decides the result" and "Status
mapping"), written apart from the product's asof.py so that the two can disagree.

A history is a list of steps `(instant, action, argument)` in whole seconds from its start;
steps at one instant fall within one second, in their order. `effective` plays it on a
model of the issue: it drops the steps that would change nothing on the forge (a label the
issue carries, a close of a closed issue, a merge of a closed pull request) and resolves
the indices the steps name. It also keeps out the few steps whose effect on the report the
forge cannot show, whatever a service does:

- a comment edited twice (its first edit leaves no trace), or deleted after an edit;
- a comment deleted that was made in a second with no other timeline entry (its instant,
  a change, is gone with it), or deleted after the settle moment while it was part of the
  history then (a service that read it before the delete cannot unread it);
- the issue deleted once it had settled (a service that read it before has its result).

`outcomes` gives every report the history allows: one, or two when the summary comment
was edited after the settle moment (the old body as read before the edit, or the new one
flagged `summary_edited_after_settle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

SETTLE = 10
LANE, HUMAN = "lane-bot", "alice"
MARKER = "<!-- controller:fingerprint:0123456789abcdef -->"
VERDICTS = {"eval-fail": "failed", "eval-pass": "passed"}  # name order: the first one wins
NEVER = 10**9

Step = tuple[int, str, Any]  # (instant, action, argument)


class Outcome(NamedTuple):
    """What a report says of one task, as the test compares it."""

    status: str
    summary: str | None  # None: not compared (a deleted issue's reason)
    edited: bool  # summary_edited_after_settle
    pull: tuple[int, bool, bool] | None  # (index among the history's pulls, merged, closer)


@dataclass
class Comment:
    """A comment: `comment` by the lane, `human`, or `marked` (a human with the marker)."""

    kind: str
    body: str
    at: int
    edit: tuple[int, str] | None = None  # (instant, new body)
    deleted_at: int | None = None

    @property
    def author(self) -> str:
        """Who posted it."""
        return LANE if self.kind == "comment" else HUMAN


@dataclass
class Pull:
    """A pull request: how it references the issue, and what became of it."""

    kind: str  # closes | fenced (the keyword in a code block: no reference) | mention
    at: int
    state: str = "open"  # open | merged | closed
    merged_at: int | None = None


@dataclass
class Story:
    """One issue's history as played: the steps kept and the timeline they made."""

    steps: list[Step] = field(default_factory=list)  # effective, indices resolved
    entries: list[tuple[int, str, Any]] = field(default_factory=list)  # (at, kind, detail)
    comments: list[Comment] = field(default_factory=list)
    pulls: list[Pull] = field(default_factory=list)
    labels: set[str] = field(default_factory=set)
    open: bool = True
    deleted_at: int | None = None

    def changes(self) -> list[int]:
        """Every instant the issue changed at: its entries and comment edits."""
        edits = [c.edit[0] for c in self.comments if c.edit is not None]
        return sorted({at for at, _kind, _detail in self.entries} | set(edits))

    def closed_after(self, moment: int) -> bool:
        """Whether the issue was closed once every change up to `moment` was made."""
        turns = [
            kind for at, kind, _ in self.entries if kind in ("close", "reopen") and at <= moment
        ]
        return bool(turns) and turns[-1] == "close"

    def settled_at(self, now: int = NEVER) -> int | None:
        """The last change before settling: the first one after which the issue is closed
        and the next change comes at least SETTLE later (or none by `now`)."""
        times = self.changes()
        for index, moment in enumerate(times):
            later = times[index + 1] if index + 1 < len(times) else now
            if self.closed_after(moment) and later >= moment + SETTLE:
                return moment
        return None


def effective(steps: list[Step]) -> Story:
    """The history as the forge can play it and show it (see the module's docstring)."""
    story = Story()
    for step in steps:
        if story.deleted_at is not None:
            break
        made = _apply(story, step)
        if made is not None:
            story.steps.append(made)
    if story.deleted_at is not None:
        return story
    if story.open:  # every history ends closed
        close = (steps[-1][0] if steps else 0, "close", LANE)
        _apply(story, close)
        story.steps.append(close)
    return _unseen_deletes_kept_out(story)


def _unseen_deletes_kept_out(story: Story) -> Story:
    moment = story.settled_at()
    assert moment is not None
    others = {at for at, kind, _ in story.entries if kind != "comment"}
    for step in [s for s in story.steps if s[1] == "delete"]:
        comment = story.comments[step[2]]
        alone = comment.at not in others
        late = comment.at <= moment and step[0] >= moment + SETTLE
        if alone or late:
            comment.deleted_at = None
            story.steps.remove(step)
    return story


def _apply(story: Story, step: Step) -> Step | None:
    """Play one step on the model; the step with its index resolved, None if no change."""
    at, action, arg = step
    if action in ("comment", "human", "marked"):
        story.entries.append((at, "comment", len(story.comments)))
        story.comments.append(Comment(action, f"{action} {at}.{len(story.comments)}", at))
        return step
    if action in ("edit", "delete"):
        return _touch_comment(story, step)
    if action in ("label", "unlabel"):
        if (arg in story.labels) == (action == "label"):
            return None
        (story.labels.add if action == "label" else story.labels.discard)(arg)
        story.entries.append((at, "label", (arg, action == "label")))
        return step
    if action in ("close", "reopen"):
        if story.open != (action == "close"):
            return None
        story.open = action == "reopen"
        story.entries.append((at, action, None))
        return step
    if action == "pull":
        if arg != "fenced":  # a keyword in a code block references nothing
            story.entries.append((at, "ref", len(story.pulls)))
        story.pulls.append(Pull(arg, at))
        return step
    if action == "delete_issue":
        if story.settled_at(now=at) is not None:
            return None
        story.deleted_at = at
        return step
    return _end_pull(story, step)


def _touch_comment(story: Story, step: Step) -> Step | None:
    at, action, arg = step
    if not story.comments:
        return None
    index = arg % len(story.comments)
    comment = story.comments[index]
    if comment.edit is not None or comment.deleted_at is not None:
        return None
    if action == "edit":
        comment.edit = (at, f"edited {index} at {at}")
    else:
        comment.deleted_at = at
    return (at, action, index)


def _end_pull(story: Story, step: Step) -> Step | None:
    """Merge or abandon an open pull request; a merge of a closing one closes the issue
    while it is open."""
    at, action, arg = step
    if not story.pulls or story.pulls[arg % len(story.pulls)].state != "open":
        return None
    index = arg % len(story.pulls)
    pull = story.pulls[index]
    if action == "abandon":
        pull.state = "closed"
        return (at, action, index)
    pull.state, pull.merged_at = "merged", at
    if pull.kind == "closes" and story.open:
        story.open = False
        story.entries.append((at, "close", index))
    return (at, action, index)


def outcomes(story: Story) -> list[Outcome]:
    """Every report of the issue the contract allows: its history as of its settle
    moment (two when the summary comment was edited after that moment)."""
    if story.deleted_at is not None:
        return [Outcome("missing", None, False, None)]
    last = story.settled_at()
    assert last is not None
    before = [(at, kind, detail) for at, kind, detail in story.entries if at <= last]
    labels = _labels_as_of(story, last)
    closes = [detail for _, kind, detail in before if kind == "close"]
    closer = closes[-1] if closes else None  # the pull whose merge made the final close
    refs = [i for _, kind, i in before if kind == "ref" and story.pulls[i].kind == "closes"]
    merged = [i for i in refs if (story.pulls[i].merged_at or NEVER) < last + SETTLE]
    chosen = closer if closer is not None else (merged or refs or [None])[-1]
    pull = None if chosen is None else (chosen, chosen in merged, chosen == closer)
    status = next((VERDICTS[name] for name in sorted(VERDICTS) if name in labels), None)
    status = status or ("passed" if closer is not None else "no_verdict")
    return [Outcome(status, summary, edited, pull) for summary, edited in _summaries(story, last)]


def _labels_as_of(story: Story, moment: int) -> set[str]:
    labels: set[str] = set()
    for at, kind, detail in story.entries:
        if kind == "label" and at <= moment:
            (labels.add if detail[1] else labels.discard)(detail[0])
    return labels


def _summaries(story: Story, last: int) -> list[tuple[str, bool]]:
    """The summary as read: the lane's last comment as of `last` (else the last one with
    the marker); its body now, flagged if edited since, or before that edit."""
    kept = [c for c in story.comments if c.at <= last and c.deleted_at is None]
    lane = [c for c in kept if c.kind == "comment"] or [c for c in kept if c.kind == "marked"]
    if not lane:
        return [("", False)]
    comment = lane[-1]
    if comment.edit is None:
        return [(comment.body, False)]
    if comment.edit[0] <= last:
        return [(comment.edit[1], False)]
    return [(comment.body, False), (comment.edit[1], True)]
