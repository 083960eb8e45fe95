"""The lane-result rules (`results.lane`), one table row per rule of docs/client/results.md
("Status mapping" and "What decides the result"): a closed issue's history, built as
Gitea's timeline shows it, read without a forge."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from timelines import RULES, History, at

from dropbox_eval.forge.wire import ForgeRefIssue
from dropbox_eval.models import TaskStatus
from dropbox_eval.results.lane import SUMMARY_LIMIT, VerdictRules, read_result, task_pull

MERGE = "Closes #1"
Pull = tuple[int, bool, bool]  # (number, merged, closed_issue) of the reported pull request


@dataclass(frozen=True)
class Row:
    """A history and what its reading must say."""

    name: str
    play: Callable[[History], Any]
    status: TaskStatus
    pull: Pull | None = None
    summary: str = ""
    details: Any = None
    commits: dict[int, str] = field(default_factory=dict)  # pull number -> merge commit


def _steps(*steps: Callable[[History], Any]) -> Callable[[History], None]:
    def play(history: History) -> None:
        for step in steps:
            step(history)

    return play


def _closed(*steps: Callable[[History], Any]) -> Callable[[History], None]:
    """The steps, then a close by hand a second after the last."""
    return _steps(*steps, lambda h: h.close(9))


def _said(body: str, who: str = "lane-bot") -> Callable[[History], None]:
    """A comment, then a close by hand: only the comment decides the row."""
    return _closed(lambda h: h.comment(1, body, who=who))


ROWS = [
    # -- the status: a verdict label, else whether a merge made the final close
    Row("eval-pass", _closed(lambda h: h.label(1, "eval-pass")), TaskStatus.PASSED),
    Row("eval-fail", _closed(lambda h: h.label(1, "eval-fail")), TaskStatus.FAILED),
    Row(
        "both labels: eval-fail comes first by name",
        _closed(lambda h: h.label(1, "eval-pass"), lambda h: h.label(2, "eval-fail")),
        TaskStatus.FAILED,
    ),
    Row(
        "no label, a merge closed it",
        _steps(lambda h: h.pull(1, 7, MERGE, merged=5), lambda h: h.close(5, "c7")),
        TaskStatus.PASSED,
        pull=(7, True, True),
    ),
    Row(
        "a verdict label wins over the merge",
        _steps(
            lambda h: h.pull(1, 7, MERGE, merged=5),
            lambda h: h.close(5, "c7"),
            lambda h: h.label(6, "eval-fail"),
        ),
        TaskStatus.FAILED,
        pull=(7, True, True),
    ),
    Row(
        "a merge after a close by hand closed nothing",
        _steps(lambda h: h.pull(1, 7, MERGE, merged=5), lambda h: h.close(3)),
        TaskStatus.NO_VERDICT,
        pull=(7, True, False),
    ),
    Row(
        "a close by hand in the second of a merge names no commit",
        _steps(lambda h: h.pull(1, 7, MERGE, merged=5), lambda h: h.close(5)),
        TaskStatus.NO_VERDICT,
        pull=(7, True, False),
    ),
    Row(
        "an abandoned pull request",
        _closed(lambda h: h.pull(1, 7, MERGE)),
        TaskStatus.NO_VERDICT,
        pull=(7, False, False),
    ),
    Row(
        "a merged pull request is named before a later abandoned one",
        _closed(lambda h: h.pull(1, 7, MERGE, merged=2), lambda h: h.pull(3, 8, MERGE)),
        TaskStatus.NO_VERDICT,
        pull=(7, True, False),
    ),
    Row("no pull request", _closed(), TaskStatus.NO_VERDICT),
    Row(
        "a closing keyword inside a code block is no reference",
        _closed(lambda h: h.pull(1, 7, "See #1.\n\n```\nCloses #1\n```", merged=2)),
        TaskStatus.NO_VERDICT,
    ),
    Row(
        "a closing keyword in inline code is not even a mention",
        _closed(lambda h: h.pull(1, 7, "Done: `Closes #1`.", merged=2)),
        TaskStatus.NO_VERDICT,
    ),
    Row(
        "a mere mention",
        _closed(lambda h: h.pull(1, 7, "Related to #1.", merged=2)),
        TaskStatus.NO_VERDICT,
    ),
    Row(
        "several merged in one second: the close's commit names the one",
        _steps(
            lambda h: h.pull(1, 8, MERGE, merged=5),
            lambda h: h.pull(2, 7, MERGE, merged=5),
            lambda h: h.close(5, "c8"),
        ),
        TaskStatus.PASSED,
        pull=(8, True, True),
        commits={7: "c7", 8: "c8"},
    ),
    Row(
        "a pull request of another repo",
        _steps(
            lambda h: h.pull(1, 3, "Closes eval/eval-acme-b1#1", merged=4, repo="lane/code"),
            lambda h: h.close(4, "c3"),
        ),
        TaskStatus.PASSED,
        pull=(3, True, True),
    ),
    # -- the comment: the lane's account, else the lane's marker
    Row(
        "the lane's own comment wins over a pasted marker",
        _closed(
            lambda h: h.comment(1, "Lane verdict."),
            lambda h: h.comment(2, "Mine. <!-- controller:x -->", who="alice"),
        ),
        TaskStatus.NO_VERDICT,
        summary="Lane verdict.",
    ),
    Row(
        "a marked comment when the lane's account wrote none",
        _said("Posted elsewhere. <!-- controller:x -->", who="ci-bot"),
        TaskStatus.NO_VERDICT,
        summary="Posted elsewhere.",
    ),
    Row("a human's comment is left out", _said("Thanks!", "alice"), TaskStatus.NO_VERDICT),
    Row(
        "the lane's login in any case",
        _said("Done.", "Lane-Bot"),
        TaskStatus.NO_VERDICT,
        summary="Done.",
    ),
    Row(
        "the lane's last comment",
        _closed(lambda h: h.comment(1, "Status: running."), lambda h: h.comment(2, "Final.")),
        TaskStatus.NO_VERDICT,
        summary="Final.",
    ),
    # -- the comment's text: summary and details
    Row(
        "the first paragraph",
        _said("First.\nStill first.\n\nSecond."),
        TaskStatus.NO_VERDICT,
        summary="First.\nStill first.",
    ),
    Row(
        "details from a json block",
        _said('Done.\n\n```json\n{"score": 0.9}\n```'),
        TaskStatus.NO_VERDICT,
        summary="Done.",
        details={"score": 0.9},
    ),
    Row(
        "unparsable json is kept",
        _said("Done.\n\n```json\n{nope\n```"),
        TaskStatus.NO_VERDICT,
        summary="Done.",
        details={"unparsed": "{nope"},
    ),
    Row(
        "HTML comments and fenced blocks are left out",
        _said("<!-- controller:fingerprint:ab12 -->\n```\nlog\n```\nAll good.\n\nMore."),
        TaskStatus.NO_VERDICT,
        summary="All good.",
    ),
    Row(
        "the summary's length",
        _said("x" * (SUMMARY_LIMIT + 50)),
        TaskStatus.NO_VERDICT,
        summary="x" * SUMMARY_LIMIT,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_each_rule_of_the_status_mapping(row: Row) -> None:
    history = History()
    row.play(history)

    def merge_commit(ref: ForgeRefIssue) -> str | None:
        return row.commits.get(ref.number)

    reading = read_result(history.issue(), history.entries, RULES, merge_commit)
    assert reading.status == row.status
    pull = reading.result.pull_request
    got = None if pull is None else (pull.number, pull.merged, pull.closed_issue)
    assert got == row.pull
    assert (reading.result.summary, reading.result.details) == (row.summary, row.details)
    assert reading.closed_at == history.issue().closed_at
    assert not reading.settled and not reading.result.summary_edited_after_settle


def test_same_second_merges_without_their_commits_name_the_last() -> None:
    """Without the merge commits the reader cannot tell them apart: the last one listed."""
    history = History()
    history.pull(1, 8, MERGE, merged=5)
    history.pull(2, 7, MERGE, merged=5)
    history.close(5, "c8")
    close = history.entries[-1]
    commits = {7: "c7", 8: "c8"}
    named = task_pull(history.entries, close, lambda ref: commits.get(ref.number))
    unnamed = task_pull(history.entries, close)
    assert named is not None and unnamed is not None
    assert (named.number, unnamed.number) == (8, 7)
    assert named.closed_issue and unnamed.closed_issue


def test_a_pull_request_names_its_repo_and_merge_time() -> None:
    history = History()
    history.pull(1, 3, "Fixes eval/eval-acme-b1#1", merged=4, repo="lane/code")
    history.close(4, "c3")
    pull = task_pull(history.entries, history.entries[-1])
    assert pull is not None
    assert (pull.repo, pull.merged_at, pull.url) == ("lane/code", at(4), "pulls/3")


def test_a_summary_edited_after_the_settle_moment_is_flagged() -> None:
    history = History()
    history.comment(1, "Edited later.", edited=30)
    history.close(2)
    reading = read_result(history.issue(), history.entries, RULES, moment=at(12))
    assert reading.settled and reading.result.summary_edited_after_settle
    before = read_result(history.issue(), history.entries, RULES, moment=at(40))
    assert not before.result.summary_edited_after_settle


def test_the_statuses_and_labels_are_settings() -> None:
    """SAAS_EVAL_PASS_LABEL, _FAIL_LABEL, _MERGED_STATUS, _UNMERGED_STATUS, _LANE_LOGIN."""
    rules = VerdictRules(
        labels={"lgtm": TaskStatus.PASSED},
        merged=TaskStatus.NO_VERDICT,
        unmerged=TaskStatus.FAILED,
        lane_login="ci",
    )
    merged = History()
    merged.pull(1, 7, MERGE, merged=2)
    merged.comment(2, "By ci.", who="ci")
    merged.close(2, "c7")
    assert read_result(merged.issue(), merged.entries, rules).status == TaskStatus.NO_VERDICT
    assert read_result(merged.issue(), merged.entries, rules).result.summary == "By ci."
    by_hand = History()
    by_hand.label(1, "eval-pass")  # not a verdict label under these rules
    by_hand.close(2)
    assert read_result(by_hand.issue(), by_hand.entries, rules).status == TaskStatus.FAILED
    by_hand.label(3, "lgtm")
    assert read_result(by_hand.issue(), by_hand.entries, rules).status == TaskStatus.PASSED


def test_the_newest_change_counts_comment_edits() -> None:
    history = History()
    history.comment(1, "Done.", edited=20)
    history.close(3)
    reading = read_result(history.issue(), history.entries, RULES)
    assert (reading.closed_at, reading.changed_at) == (at(3), at(20))
