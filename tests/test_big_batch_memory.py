"""A big batch is held once: a visit lets go of each task as its change is stored and hands
over the store's tasks at its end, instead of its own changed copies; the journal is parsed
a line at a time as the store catches up, and archiving copies the tasks file and the
report into the history a block at a time. What comes out is what the whole-in-memory ways
gave."""

from __future__ import annotations

import gc
import json
import tracemalloc
import weakref
from pathlib import Path

import pytest
from conftest import stored_tasks, tasks

from dropbox_eval.app import build_app
from dropbox_eval.config import Settings
from dropbox_eval.forge.markers import opened
from dropbox_eval.models import BatchFile, BatchRecord, TaskRecord, TaskStatus, utcnow
from dropbox_eval.results.opentasks import OpenTasks
from dropbox_eval.results.reading import ended
from dropbox_eval.results.recording import VisitChanges
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.files import dumps
from dropbox_eval.store.history import COPY_BLOCK, History

pytestmark = pytest.mark.tinydb_files  # the TinyDB engine's cache, journal and history
BATCH = "20261201-000000-big"
COUNT = 1200


def _open_batch(state: Path) -> tuple[TinyDBStore, BatchRecord]:
    """A TinyDB store holding one batch whose every task has its issue open."""
    store = stored_tasks(state, BATCH, COUNT)
    now = utcnow()
    store.update_tasks(BATCH, {f"t{n}": opened(n, f"http://f/{n}") for n in range(1, COUNT + 1)})
    batch = BatchRecord(batch_id=BATCH, client_id="acme", repo="o/r", total=COUNT, created_at=now)
    return store, batch


def _as_stored(state: Path) -> list[dict[str, object]]:
    """The batch's tasks as another process reads them, JSON-ready."""
    return [t.model_dump(mode="json") for t in TinyDBStore(state).get_tasks(BATCH)]


def _visit(store: TinyDBStore, batch: BatchRecord, changed: int) -> list[TaskRecord] | None:
    """One visit that finishes the first `changed` tasks, a page of 100 at a time."""
    open_tasks = OpenTasks(store, [batch], set())
    changes = VisitChanges(store, open_tasks, set())
    for number in range(1, changed + 1):
        owner = open_tasks.get(number)
        assert owner is not None
        changes.add(owner, ended(TaskStatus.PASSED, f"verdict {number}"))
        if number % 100 == 0:
            changes.flush()
    changes.flush()
    after = changes.applied(BATCH)
    assert BATCH not in open_tasks.tasks and open_tasks.get(1) is None  # let go of
    return after


def test_a_visit_changing_a_big_batch_hands_over_the_stored_tasks(tmp_path: Path) -> None:
    store, batch = _open_batch(tmp_path)
    after = _visit(store, batch, COUNT // 2)
    assert after is not None
    assert [t.model_dump(mode="json") for t in after] == _as_stored(tmp_path)
    assert sum(t.status == TaskStatus.PASSED for t in after) == COUNT // 2
    assert after[0].result is not None and after[0].result.summary == "verdict 1"


def test_a_visit_changing_few_tasks_hands_over_the_unchanged_as_read(tmp_path: Path) -> None:
    store, batch = _open_batch(tmp_path)
    before = store.get_tasks(BATCH)
    after = _visit(store, batch, 10)
    assert after is not None
    assert after[10:] == before[10:] and after[10] is before[10]  # the unchanged, as read
    assert [t.model_dump(mode="json") for t in after] == _as_stored(tmp_path)


def test_a_visit_lets_go_of_each_task_once_its_change_is_stored(tmp_path: Path) -> None:
    """The store renews its copy of a changed task when it is read (here by another reader
    after each page, as a journal compaction or the API does): the visit must not keep
    the old one, or a big batch's settling results are held twice until the visit ends."""
    store, batch = _open_batch(tmp_path)
    open_tasks = OpenTasks(store, [batch], set())
    changes = VisitChanges(store, open_tasks, set())
    old: list[weakref.ref[TaskRecord]] = []
    for number in range(1, 301):
        owner = open_tasks.get(number)
        assert owner is not None
        old.append(weakref.ref(owner[1]))
        changes.add(owner, ended(TaskStatus.PASSED, f"verdict {number}"))
        del owner
        if number % 100 == 0:
            changes.flush()
            assert store.get_tasks(BATCH)[number - 1].status == TaskStatus.PASSED
    gc.collect()
    assert [ref() for ref in old] == [None] * 300  # the visit is not over: none is kept
    kept = open_tasks.get(301)  # the unchanged ones are still the visit's
    assert kept is not None and kept[1] is store.get_tasks(BATCH)[300]
    after = changes.applied(BATCH)
    assert after is not None and [t.status for t in after[299:301]] == [
        TaskStatus.PASSED,
        TaskStatus.OPEN,
    ]


def test_the_opener_lets_go_of_each_task_record_as_its_issue_is_recorded(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store renews a task's record as its issue number is written (the task cache
    takes its own writes): an opener holding the records it read held a 50,000-task
    intake twice. It holds only what each create sends (the spec, shared)."""
    monkeypatch.setattr("dropbox_eval.intake.opening.FLUSH_SECONDS", 0.0)  # every answer
    app = build_app(settings)
    app.billing.add_client("acme", 100)
    batch = BatchFile.model_validate({"client_id": "acme", "tasks": tasks(40)})
    batch_id = app.intake.accept(batch, "acme", open_now=False)["batch_id"]
    records = {t.task_id: weakref.ref(t) for t in app.store.get_tasks(batch_id)}
    recorded: set[str] = set()
    still_held: list[int] = []
    real = app.store.update_tasks

    def recording(batch: str, changes: dict[str, dict[str, object]]) -> None:
        real(batch, changes)
        recorded.update(changes)
        gc.collect()
        still_held.append(sum(records[task_id]() is not None for task_id in recorded))

    monkeypatch.setattr(app.store, "update_tasks", recording)
    assert app.intake.open_issues(batch_id) == 40
    assert len(still_held) > 2 and recorded == set(records)  # recorded a few at a time
    assert still_held == [0] * len(still_held)  # the opener held none of the old records


def test_catching_up_a_long_journal_gives_the_tasks_a_fresh_read_gives(tmp_path: Path) -> None:
    store, batch = _open_batch(tmp_path)
    kept = store.get_tasks(BATCH)  # the cache's position: every later line is caught up
    other = TinyDBStore(tmp_path)  # another process writes, line after line
    for start in range(1, COUNT, 50):
        other.update_tasks(
            BATCH, {f"t{n}": ended(TaskStatus.FAILED, "no") for n in range(start, start + 50)}
        )
        other.update_tasks(BATCH, {f"t{start}": {"issue_url": f"http://g/{start}"}})
    caught_up = store.get_tasks(BATCH)
    assert [t.model_dump(mode="json") for t in caught_up] == _as_stored(tmp_path)
    assert caught_up[0].issue_url == "http://g/1" and caught_up[0].status == TaskStatus.FAILED
    assert kept[0].status == TaskStatus.OPEN  # a list handed out before keeps its tasks


def _segment_line(history: History, batch_id: str, key: str) -> bytes:
    line = history._record_line(batch_id)
    assert line is not None
    offset, length = line[key]
    segment = history.folder / batch_id[:6] / "history.jsonl"
    with segment.open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)


def test_a_history_entry_copied_from_the_tasks_file_is_the_one_its_bytes_give(
    tmp_path: Path,
) -> None:
    table = {"tasks": {str(n): {"task_id": f"t{n}", "body": "x" * 500} for n in range(3000)}}
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_bytes(dumps(table))
    assert tasks_file.stat().st_size > 1.5 * COPY_BLOCK  # copied in more than one block
    # escapes on both sides of the block boundaries
    report = (b'{\n  "s": "a \\"quoted\\" \\\\ path"\n}\n' * (COPY_BLOCK // 10))[: 3 * COPY_BLOCK]
    (tmp_path / "archive").mkdir()
    history = History(tmp_path / "archive")
    copied, whole = "20261201-000000-aaaa", "20261201-000000-bbbb"
    history.add({"batch_id": copied, "status": "emitted"}, tasks_file, report)
    history.add({"batch_id": whole, "status": "emitted"}, tasks_file.read_bytes(), report)
    assert history.tasks(copied) == history.tasks(whole) == list(table["tasks"].values())
    assert history.report(copied) == history.report(whole) == report
    assert _segment_line(history, copied, "report_at") == (
        dumps({"batch_id": copied, "report": report.decode("ascii")}) + b"\n"
    )
    assert _segment_line(history, copied, "tasks_at") == _segment_line(
        history, whole, "tasks_at"
    ).replace(whole.encode(), copied.encode())
    line = json.loads(_segment_line(history, copied, "tasks_at"))
    assert line["batch_id"] == copied and line["table"] == table


def test_archiving_a_big_report_escapes_it_a_small_block_at_a_time(tmp_path: Path) -> None:
    """orjson sets aside room for the worst case when it escapes a string (about 14 bytes a
    character): the report is escaped a small block at a time (history.py ESCAPE_BLOCK),
    so archiving a 12 MB report never needs tens of MB at once."""
    report_file = tmp_path / "report.json"
    report_file.write_bytes(b'{\n  "summary": "a \\"quoted\\" line"\n}\n' * (4 * COPY_BLOCK // 36))
    (tmp_path / "archive").mkdir()
    history = History(tmp_path / "archive")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history.add({"batch_id": BATCH, "status": "emitted"}, b'{"tasks":{}}', report_file)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 2 * COPY_BLOCK  # a 1 MB block escaped at once took 16 MB
    assert history.report(BATCH) == report_file.read_bytes()
