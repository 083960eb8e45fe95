"""Fair intake at the inbox: ready files are read client by client in turn (weighted round
robin), so one client's flood of drops never stands in front of another client's drop, and
one client's backlog in memory is bounded (the rest waits on disk, nothing is lost); and an
invalid file is cheap to refuse: its error file and its move are its only durable writes."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import serving, tasks, wait_for
from helpers import drop, receipt_of

from dropbox_eval.app import App
from dropbox_eval.inbox import ReadinessTracker
from dropbox_eval.protocol.rejections import RejectionLog
from dropbox_eval.util.roundrobin import RoundRobin
from dropbox_eval.workers.inbox import INBOX_WORKERS

T = TypeVar("T")
FLOOD = 80


def served(line: RoundRobin[T]) -> list[T]:
    """Every item of `line`, in the order it serves them."""
    return [line.pop()[1] for _ in range(len(line))]


def test_turns_follow_the_weights_and_a_newcomer_waits_one_turn_per_client() -> None:
    line: RoundRobin[str] = RoundRobin(lambda client: {"big": 3}.get(client, 1))
    for index in range(7):
        line.push("big", f"big{index}")
    line.push("small", "small0")
    line.push("small", "small1")
    assert line.counts() == {"big": 7, "small": 2}
    assert served(line) == [
        *("big0", "big1", "big2", "small0"),
        *("big3", "big4", "big5", "small1"),
        "big6",
    ]
    with pytest.raises(IndexError):
        line.pop()
    # a client arriving behind a long backlog is served after the current turn ends
    for index in range(100):
        line.push("flood", f"flood{index}")
    assert line.pop() == ("flood", "flood0")
    line.push("late", "late0")
    assert [line.pop()[1] for _ in range(2)] == ["flood1", "late0"]
    assert len(line) == 98 and line.count("late") == 0


def test_a_line_holds_at_most_its_bound_per_client() -> None:
    line: RoundRobin[int] = RoundRobin(bound=2)
    assert line.push("a", 1) and line.push("a", 2)
    assert line.full("a") and not line.push("a", 3)
    assert line.push("b", 1) and not line.full("b")
    assert served(line) == [1, 1, 2]
    assert not line.full("a") and line.push("a", 4)


def test_the_tracker_keeps_a_bounded_share_per_client_and_asks_for_the_rest(
    tmp_path: Path,
) -> None:
    paths = [tmp_path / "a" / f"{index}.json" for index in range(6)]
    other = tmp_path / "b" / "0.json"
    for path in [*paths, other]:
        path.parent.mkdir(exist_ok=True)
        path.write_text("{}")
    tracker = ReadinessTracker(0, group_of=lambda path: path.parent.name, per_group=4)
    assert [tracker.touch(path) for path in paths] == [True] * 4 + [False] * 2
    assert tracker.touch(paths[0])  # tracked already: an event on it is taken
    assert tracker.renamed(other)  # another client has its own share
    assert tracker.pending() == 5 and tracker.overflowed() and not tracker.refill_due()
    declined = paths[2:4]
    taken = list(tracker.ready(wanted=lambda path: path not in declined))
    assert sorted(taken) == sorted([*paths[:2], other])
    assert tracker.pending() == 2  # the declined ones, unchecked, still tracked
    assert tracker.refill_due() and not tracker.refill_due()  # down to half: asked once
    assert tracker.touch(paths[4]) and tracker.touch(paths[5]) and tracker.overflowed() is False


def test_one_clients_flood_does_not_delay_another_clients_drop(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """Client alpha's 80 one-task drops are in the inbox before beta's one: beta's receipt
    is filed within the first turns; and every drop of alpha's is filed too with a backlog of
    20 (the rest found by rescans as it drains: the periodic rescan is an hour away)."""
    app.billing.add_client("alpha", 1000)
    app.billing.add_client("beta", 100)
    app.settings.inbox_client_backlog = 20
    app.settings.rescan_interval = 3600
    app.settings.quiet_period = 0
    flood = [
        drop(app.inbox.root, f"a{index:03}.json", {"tasks": tasks(1, f"a{index}-")}, "alpha")
        for index in range(FLOOD)
    ]
    single = drop(app.inbox.root, "b.json", {"tasks": tasks(1)}, "beta")
    caplog.set_level(logging.INFO, logger="dropbox_eval")
    with serving(app):
        assert wait_for(lambda: receipt_of(single).exists())
        assert wait_for(lambda: len(filed(caplog)) == FLOOD + 1)
    order = filed(caplog)
    assert sorted(order) == sorted([*(path.name for path in flood), single.name])
    # FIFO would file it last (alpha's folder sorts first); by turns it is among the first
    # INBOX_WORKERS + 2 (the workers' first hand-out and one turn per client)
    assert order.index(single.name) < INBOX_WORKERS + 2, order[: INBOX_WORKERS + 2]
    assert json.loads(receipt_of(single).read_text())["client_id"] == "beta"


def filed(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The names of the drops the service filed (accepted or rejected), in filing order."""
    names = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith("file ") and (
            ": accepted as" in message or ": rejected (" in message
        ):
            names.append(Path(message.split(":")[0].removeprefix("file ")).name)
    return names


DURABLE = ("fsync", "replace", "rename", "link", "unlink")
INVALID = {
    "malformed": "{not json",
    "hostile": {"tasks": [{"task_id": "../../etc/passwd", "title": "t"}]},
    "unfunded": {"tasks": tasks(1)},
}


def counting(calls: Counter[str], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    return counted


def test_refusing_an_invalid_file_costs_its_error_file_and_the_move(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed, hostile or unfunded file: the error file (its bytes synced, renamed
    into place), the drop linked beside it and unlinked, the two folders synced; nothing
    else (the rejection log's line is appended, its counts written once per rotation)."""
    app.billing.add_client("acme", 0)
    for kind, content in INVALID.items():  # the first makes `rejected/` and the log's mark
        assert app.inbox.process(drop(app.inbox.root, f"{kind}0.json", content, "acme")).status == (
            "rejected"
        )
    calls: Counter[str] = Counter()
    for name in DURABLE:
        monkeypatch.setattr(os, name, counting(calls, name, getattr(os, name)))
    for kind, content in INVALID.items():
        dropped = drop(app.inbox.root, f"{kind}1.json", content, "acme")
        calls.clear()
        outcome = app.inbox.process(dropped)
        assert outcome.status == "rejected" and outcome.path is not None
        assert calls == {"fsync": 3, "replace": 1, "link": 1, "unlink": 1}, (kind, calls)
        assert (outcome.path.parent / f"{dropped.name}.error.json").exists()
    assert RejectionLog(app.settings.state_path).counts() == {
        "invalid_json": 2,
        "invalid_batch": 2,
        "unfunded": 2,
    }


def test_rejection_counts_are_kept_through_rotations_a_kill_and_an_older_counts_file(
    tmp_path: Path,
) -> None:
    log = RejectionLog(tmp_path, max_bytes=300)
    for n in range(9):
        log.append({"reason": "too_large", "message": "y" * 40, "file": f"b{n}.json"})
    assert log.rotated.exists() and len(log.recent(100)) < 9  # rotated, more than once
    assert log.counts() == {"too_large": 9}
    # a kill between marking the lines file counted and renaming it away
    info = log.path.stat()
    mark = {"counts": log.counts(), "inode": info.st_ino, "offset": info.st_size}
    log.counts_path.write_text(json.dumps(mark))
    assert RejectionLog(tmp_path, max_bytes=300).counts() == {"too_large": 9}
    log.append({"reason": "invalid_json", "message": "x", "file": "a.json"})
    assert log.counts() == {"too_large": 9, "invalid_json": 1}
    # a counts file from before the marks: the totals of every line kept so far
    log.counts_path.write_text(json.dumps({"too_large": 20, "invalid_json": 1}))
    older = RejectionLog(tmp_path, max_bytes=300)
    assert older.counts() == {"too_large": 20, "invalid_json": 1}
    for n in range(6):
        older.append({"reason": "unfunded", "message": "z" * 40, "file": f"c{n}.json"})
    assert RejectionLog(tmp_path).counts() == {"too_large": 20, "invalid_json": 1, "unfunded": 6}
