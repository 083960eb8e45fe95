"""Seventeen lane histories and the report row each one means, and a player
that makes a history happen on the sandbox forge.

A history is a list of (instant, action, argument), instants in seconds from its start, the
settle time `SETTLE`. Actions: `comment` (by the lane's login), `human`, `marked` (a human
carrying the lane's marker), `label`/`unlabel` (by the lane), `close`/`reopen` (argument:
who), `pull` (a pull request saying `Closes #N`), `merge`/`abandon` (argument: which pull
request of the history), `edit` (argument: which comment, new body), `delete` (which
comment).

Each expected row is written by hand from the rule (README "Why settle" and "Status
mapping"): the last change before settling, t, is the first change after which the issue
is closed and nothing changes for `SETTLE`; the result is the history as of t + SETTLE.
A comment edited after that moment is read as it is when read: `late` is what a reading
after the edit gives (its body, and `summary_edited_after_settle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dropbox_eval.sandbox import HUMAN, LANE_BOT, ForgeState

SETTLE = 10
MARKER = "<!-- controller:fingerprint:0123456789abcdef -->"
PASS, FAIL = "eval-pass", "eval-fail"
Event = tuple[int, str, Any]
Pull = tuple[bool, bool] | None  # (merged, closed_issue) of the reported pull request


def _json(text: str, details: str) -> str:
    return f"{text}\n\n```json\n{details}\n```"


@dataclass(frozen=True)
class Row:
    """The report row a history means: status, summary, details and pull request; `late`,
    for a summary edited after the settle moment, the (summary, details) a reading after
    the edit reports along with `summary_edited_after_settle: true`."""

    status: str
    summary: str
    details: Any = None
    pull: Pull = None
    late: tuple[str, Any] | None = None


@dataclass(frozen=True)
class History:
    """A named history and what it means."""

    name: str
    events: list[Event]
    row: Row


def verdict(at: int, body: str, label: str, who: str = LANE_BOT) -> list[Event]:
    """The lane's comment, verdict label and close, all at `at`."""
    return [(at, "comment", body), (at, "label", label), (at, "close", who)]


HISTORIES = [
    History(  # the issue's example: the label swapped and the summary edited after 14 s
        "swapped_and_edited_after_settling",
        verdict(0, _json("PASS early", '{"score": 1}'), PASS)
        + [(14, "unlabel", PASS), (14, "label", FAIL)]
        + [(14, "edit", (0, _json("FAIL late", '{"score": 0}')))],
        Row("passed", "PASS early", {"score": 1}, late=("FAIL late", {"score": 0})),
    ),
    History(  # settled at 0 (t=0): the reopen at 14 and the close at 16 come after
        "reopened_and_reclosed_failed_after_settling",
        verdict(0, "PASS early", PASS)
        + [(14, "reopen", HUMAN), (14, "unlabel", PASS), (14, "label", FAIL)]
        + [(14, "comment", "FAIL late"), (16, "close", LANE_BOT)],
        Row("passed", "PASS early"),
    ),
    History(  # t=1, merged at 5 < 11: merged, but the issue was closed already
        "merged_within_the_window_after_a_close_by_hand",
        [(0, "pull", None), (1, "comment", "closed by hand"), (1, "close", HUMAN)]
        + [(5, "merge", 0)],
        Row("no_verdict", "closed by hand", pull=(True, False)),
    ),
    History(  # t=1, merged at 14 >= 11: not merged as of the settle moment
        "merged_after_the_window_after_a_close_by_hand",
        [(0, "pull", None), (1, "comment", "closed by hand"), (1, "close", HUMAN)]
        + [(14, "merge", 0)],
        Row("no_verdict", "closed by hand", pull=(False, False)),
    ),
    History(  # t=3: the label was gone by then
        "verdict_label_removed_3_s_after_the_close",
        [*verdict(0, "PASS?", PASS), (3, "unlabel", PASS)],
        Row("no_verdict", "PASS?"),
    ),
    History(
        "reopened_before_settling_then_reclosed",
        verdict(0, "first try", FAIL)
        + [(4, "reopen", LANE_BOT), (4, "unlabel", FAIL)]
        + verdict(6, "second try", PASS),
        Row("passed", "second try"),
    ),
    History(  # t=6; the edit at 4 is before it: no flag
        "every_change_within_the_window",
        [(0, "comment", "draft"), (0, "close", LANE_BOT), (2, "label", PASS)]
        + [(4, "edit", (0, _json("Lane verdict: PASS.", '{"checks": 7}')))]
        + [(6, "human", "thanks!")],
        Row("passed", "Lane verdict: PASS.", {"checks": 7}),
    ),
    History(  # settled as of 10, even for a service that never saw it closed
        "closed_at_0_reopened_at_14_and_left_open",
        [*verdict(0, "PASS early", PASS), (14, "reopen", HUMAN)],
        Row("passed", "PASS early"),
    ),
    History(  # a deleted comment is gone from the history: the lane's earlier one is left
        "summary_deleted_before_the_settle_moment",
        [(0, "comment", "first words"), *verdict(1, "PASS final", PASS), (5, "delete", 1)],
        Row("passed", "first words"),
    ),
    History(
        "the_merge_closed_it",
        [(0, "pull", None), (2, "comment", "merged it"), (3, "merge", 0)],
        Row("passed", "merged it", pull=(True, True)),
    ),
    History(  # a verdict label wins over the merge
        "the_merge_closed_it_then_a_fail_label",
        [(0, "pull", None), (1, "merge", 0)]
        + [(4, "comment", _json("FAIL: tests broke", '{"failed": 3}')), (4, "label", FAIL)],
        Row("failed", "FAIL: tests broke", {"failed": 3}, pull=(True, True)),
    ),
    History(
        "abandoned_then_closed_failed",
        [(0, "pull", None), (2, "abandon", 0), *verdict(3, "gave up", FAIL)],
        Row("failed", "gave up", pull=(False, False)),
    ),
    History(  # the lane's login wrote a comment: a pasted marker replaces nothing
        "a_human_pastes_the_marker_after_the_lane",
        [*verdict(0, "Lane verdict: PASS.", PASS), (3, "marked", "Re-run by hand: FAIL.")],
        Row("passed", "Lane verdict: PASS."),
    ),
    History(  # a lane posting through another account: its marker makes the comment its own
        "the_marker_alone_names_the_summary",
        [(0, "human", "looking at it"), (1, "marked", "Re-run by hand: PASS.")]
        + [(1, "label", PASS), (1, "close", HUMAN)],
        Row("passed", "Re-run by hand: PASS."),
    ),
    History(  # t=0: what comes at 15 and 16 is after the settle moment
        "comments_and_a_pull_request_after_settling",
        verdict(0, "PASS early", PASS)
        + [(15, "comment", "PASS again"), (15, "human", "thanks"), (15, "pull", None)]
        + [(16, "merge", 0)],
        Row("passed", "PASS early"),
    ),
    History(  # both labels as of 0: eval-fail comes first by name
        "both_labels_then_fail_removed_after_settling",
        [(0, "comment", "mixed"), (0, "label", PASS), (0, "label", FAIL)]
        + [(0, "close", LANE_BOT), (14, "unlabel", FAIL)],
        Row("failed", "mixed"),
    ),
    History(
        "closed_by_a_human_without_a_verdict",
        [(0, "human", "not needed"), (0, "close", HUMAN)],
        Row("no_verdict", ""),
    ),
]


@dataclass
class Copy:
    """One copy of a history's issue (one per service), and what was made on it."""

    repo: str
    number: int
    pulls: list[int] = field(default_factory=list)
    comments: list[int] = field(default_factory=list)

    @property
    def owner_name(self) -> tuple[str, str]:
        owner, name = self.repo.split("/")
        return owner, name


class Player:
    """Plays history events on every copy of an issue at once."""

    def __init__(self, state: ForgeState, copies: list[Copy]) -> None:
        self.state = state
        self.copies = copies

    def play(self, action: str, arg: Any) -> None:
        """One change, on each copy."""
        for copy in self.copies:
            getattr(self, f"_{action}")(copy, arg)

    def _close(self, copy: Copy, who: str) -> None:
        self.state.edit_issue(*copy.owner_name, copy.number, state="closed", doer=who)

    def _reopen(self, copy: Copy, who: str) -> None:
        self.state.edit_issue(*copy.owner_name, copy.number, state="open", doer=who)

    def _pull(self, copy: Copy, _arg: None) -> None:
        owner, name = copy.owner_name
        branch = f"lane/{copy.number}-{len(copy.pulls)}"
        body = f"Closes #{copy.number}"
        made = self.state.create_pull(
            owner, name, LANE_BOT, head=branch, base="main", title="Change", body=body
        )
        copy.pulls.append(int(made["number"]))

    def _merge(self, copy: Copy, index: int) -> None:
        self.state.merge_pull(*copy.owner_name, copy.pulls[index], LANE_BOT)

    def _abandon(self, copy: Copy, index: int) -> None:
        self.state.edit_pull(*copy.owner_name, copy.pulls[index], LANE_BOT, state="closed")

    def _label(self, copy: Copy, label: str) -> None:
        self.state.add_issue_labels(*copy.owner_name, copy.number, names=[label], doer=LANE_BOT)

    def _unlabel(self, copy: Copy, label: str) -> None:
        owner, name = copy.owner_name
        ids = {lb["name"]: lb["id"] for lb in self.state.list_labels(owner, name)[0]}
        self.state.remove_issue_label(owner, name, copy.number, int(ids[label]), LANE_BOT)

    def _comment(self, copy: Copy, body: str, who: str = LANE_BOT) -> None:
        made = self.state.create_comment(*copy.owner_name, copy.number, who, body)
        copy.comments.append(int(made["id"]))

    def _human(self, copy: Copy, body: str) -> None:
        self._comment(copy, body, HUMAN)

    def _marked(self, copy: Copy, body: str) -> None:
        self._comment(copy, f"{body}\n\n{MARKER}", HUMAN)

    def _edit(self, copy: Copy, arg: tuple[int, str]) -> None:
        index, body = arg
        self.state.edit_comment(*copy.owner_name, copy.comments[index], LANE_BOT, body)

    def _delete(self, copy: Copy, index: int) -> None:
        self.state.delete_comment(*copy.owner_name, copy.comments[index], LANE_BOT)


def reported(result: dict[str, Any]) -> Row:
    """A report result as a row: the pull request by what became of it (its number differs
    from copy to copy); `late` holds the summary and details when the result says they were
    edited after the settle moment."""
    pull = result["pull_request"]
    got = (pull["merged"], pull["closed_issue"]) if pull is not None else None
    body = (result["summary"], result["details"])
    if result.get("summary_edited_after_settle"):
        assert result["summary_edited_after_settle"] is True
        return Row(result["status"], "", None, got, late=body)
    return Row(result["status"], *body, pull=got)


def early(row: Row) -> Row:
    """The row a reading before a late edit gives."""
    return Row(row.status, row.summary, row.details, row.pull)


def late(row: Row) -> Row:
    """The row a reading after a late edit gives (as `reported` shows it)."""
    return Row(row.status, "", None, row.pull, late=row.late) if row.late else row
