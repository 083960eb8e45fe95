"""The history as of the settle moment (asof.py), on timelines shaped as Gitea sends them."""

from __future__ import annotations

from datetime import timedelta

from timelines import RULES, SETTLE, History, at

from dropbox_eval.models import TaskStatus
from dropbox_eval.results.asof import as_of, settled_change
from dropbox_eval.results.lane import read_result


def test_changes_after_the_settle_moment_are_cut_off() -> None:
    history = History()
    history.comment(0, "PASS early", edited=14)
    history.label(0, "eval-pass")
    history.add(0, "close")
    history.label(14, "eval-pass", on=False)
    history.label(14, "eval-fail")
    assert history.settled(now=40) == ("passed", "PASS early", True)


def test_a_reopen_after_the_settle_moment_leaves_the_settled_close() -> None:
    history = History()
    history.label(0, "eval-pass")
    history.add(0, "close")
    history.add(14, "reopen")
    assert history.settled(now=60) == ("passed", "", False)
    history.add(16, "close")
    history.label(16, "eval-fail")
    assert history.settled(now=60) == ("passed", "", False)


def test_a_reopen_within_the_window_moves_the_settle_moment() -> None:
    history = History()
    history.label(0, "eval-pass")
    history.add(0, "close")
    history.add(5, "reopen")
    assert history.settled(now=60) is None  # open: never settled
    history.add(8, "close")
    history.label(8, "eval-pass", on=False)
    history.label(8, "eval-fail")
    assert history.settled(now=17) is None  # 9 s after the last change
    assert history.settled(now=18) == ("failed", "", False)


def test_a_verdict_label_removed_within_the_window_is_no_verdict() -> None:
    history = History()
    history.label(0, "eval-pass")
    history.add(0, "close")
    history.label(3, "eval-pass", on=False)
    assert history.settled(now=13) == ("no_verdict", "", False)


def test_a_change_at_the_settle_moment_itself_comes_after_it() -> None:
    history = History()
    history.add(0, "close")
    history.label(10, "eval-fail")
    assert history.settled(now=30) == ("no_verdict", "", False)


def test_a_merge_within_the_window_counts_and_one_after_it_does_not() -> None:
    def pull_history(merged: int) -> History:
        history = History()
        pull = {"merged": True, "merged_at": at(merged), "html_url": "p"}
        ref = {"number": 7, "pull_request": pull}
        history.add(0, "pull_ref", ref_action="closes", ref_issue=ref)
        history.add(2, "close")  # by hand
        return history

    for merged, expected in ((5, True), (11, True), (12, False), (30, False)):
        history = pull_history(merged)
        issue = history.issue()
        last = settled_change(issue, history.entries, SETTLE, at(60))
        assert last == at(2)
        then = as_of(issue, history.entries, last, SETTLE)
        reading = read_result(then.issue, then.timeline, RULES, moment=last)
        pull = reading.result.pull_request
        assert pull is not None and pull.merged is expected and not pull.closed_issue
        assert reading.status == TaskStatus.NO_VERDICT  # a merge after a close closed nothing


def test_with_no_settle_time_the_close_and_its_second_are_final() -> None:
    history = History()
    history.comment(0, "done")
    history.add(0, "close")
    history.label(0, "eval-pass")
    history.label(4, "eval-fail")
    issue = history.issue()
    last = settled_change(issue, history.entries, timedelta(0), at(4))
    assert last == at(0)
    then = as_of(issue, history.entries, last, timedelta(0))
    assert then.issue.labels == ["eval-pass"] and len(then.timeline) == 3


def test_the_lane_s_own_comment_wins_over_a_pasted_marker() -> None:
    history = History()
    history.comment(0, "lane verdict")
    history.comment(1, "hand verdict <!-- controller:x -->", who="alice")
    history.add(1, "close")
    assert history.settled(now=20) == ("no_verdict", "lane verdict", False)
    marked_only = History()
    marked_only.comment(0, "posted elsewhere <!-- controller:x -->", who="ci-bot")
    marked_only.add(0, "close")
    assert marked_only.settled(now=20) == ("no_verdict", "posted elsewhere", False)


def test_a_comment_made_after_the_settle_moment_is_not_the_summary() -> None:
    history = History()
    history.comment(0, "first")
    history.add(0, "close")
    history.comment(20, "second")
    assert history.settled(now=60) == ("no_verdict", "first", False)
