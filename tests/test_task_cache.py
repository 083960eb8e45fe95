"""Reading a batch's tasks costs what changed since the last read, not the batch's size:
the parsed tasks are brought up to date by the journal's new lines, whoever wrote them,
and parsed whole again only when the base file is replaced (a compaction)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import stored_tasks

from dropbox_eval.forge.markers import opened
from dropbox_eval.models import TaskRecord, TaskStatus
from dropbox_eval.store import files
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.rows import dump

BATCH = "b1"
TASKS = 400


@pytest.fixture
def base_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every read of a base tasks file (a parse of the whole batch), in order."""
    seen: list[Path] = []
    real = files.read_table

    def counted(path: Path, table: str) -> list[dict[str, object]]:
        seen.append(path)
        return real(path, table)

    monkeypatch.setattr("dropbox_eval.store.tasks.read_table", counted)
    return seen


def _new_batch(state: Path) -> TinyDBStore:
    return stored_tasks(state, BATCH, TASKS)


def _as_read_afresh(state: Path) -> list[TaskRecord]:
    return TinyDBStore(state).get_tasks(BATCH)


def test_recording_issue_numbers_in_flushes_parses_the_batch_once(
    tmp_path: Path, base_reads: list[Path]
) -> None:
    store = _new_batch(tmp_path)
    other = TinyDBStore(tmp_path)  # another process (the CLI) writing the same batch
    assert len(store.get_tasks(BATCH)) == TASKS
    for flush in range(20):  # the opener records what it created every few seconds
        first = flush * 20
        store.update_tasks(
            BATCH, {f"t{n}": opened(n, f"http://f/{n}") for n in range(first + 1, first + 21)}
        )
        if flush % 5 == 4:
            other.update_tasks(BATCH, {f"t{first + 1}": {"status": TaskStatus.MISSING}})
        for _ in range(3):  # the opener, the receipt and a poll read meanwhile
            read = store.get_tasks(BATCH)
        assert read[first + 19].issue_number == first + 20
        assert read[first].status == (TaskStatus.MISSING if flush % 5 == 4 else TaskStatus.OPEN)
    assert len(base_reads) == 1  # one parse for 20 flushes and 4 writes of another process
    numbers = store.issue_numbers(BATCH)
    assert len(base_reads) == 1
    assert list(numbers.items())[398:] == [("t399", 399), ("t400", 400)]  # the batch's order
    assert store.get_tasks(BATCH) == _as_read_afresh(tmp_path)

    with other.record_locked(BATCH):
        other.tasks.compact(BATCH)  # the base is replaced: read whole once more
    reads = len(base_reads)
    assert store.get_tasks(BATCH) == _as_read_afresh(tmp_path)
    assert len(base_reads) == reads + 2  # this reader's parse, and the fresh one compared


@pytest.mark.parametrize("block", [None, 5, 64])
def test_a_line_cut_short_or_still_being_written_is_read_like_a_whole_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int | None
) -> None:
    """Whatever the size of the blocks the journal is read in (tasks.py BLOCK, made small
    here so that lines straddle them)."""
    if block is not None:
        monkeypatch.setattr("dropbox_eval.store.tasks.BLOCK", block)
    store = _new_batch(tmp_path)
    journal = tmp_path / "tasks" / f"{BATCH}.journal"

    def numbers() -> list[int | None]:
        return list(store.issue_numbers(BATCH).values())[:6]

    store.update_tasks(BATCH, {"t1": opened(1, "http://f/1")})
    assert numbers() == [1, None, None, None, None, None]
    with journal.open("ab") as handle:  # an append in flight, or one a crash cut short
        handle.write(b'{"t2":{"issue_number":2')
    assert numbers() == [1, None, None, None, None, None]
    TinyDBStore(tmp_path).update_tasks(BATCH, {"t3": opened(3, "http://f/3")})
    assert numbers() == [1, None, 3, None, None, None]
    with journal.open("ab") as handle:  # a whole line whose newline a crash cut
        handle.write(b'{"t4":{"issue_number":4}}')
    assert numbers() == [1, None, 3, 4, None, None]
    store.update_tasks(BATCH, {"t4": {"issue_number": 40}, "t5": opened(5, "http://f/5")})
    assert numbers() == [1, None, 3, 40, 5, None]
    assert store.get_tasks(BATCH) == _as_read_afresh(tmp_path)


def test_readers_at_once_share_one_parse(tmp_path: Path, base_reads: list[Path]) -> None:
    store = _new_batch(tmp_path)
    together = threading.Barrier(3)

    def read(_: int) -> list[TaskRecord]:  # the opener, the receipt and a poll
        together.wait()
        return store.get_tasks(BATCH)

    with ThreadPoolExecutor(max_workers=3) as pool:
        first, *others = pool.map(read, range(3))
    assert len(base_reads) == 1
    assert len(first) == TASKS and all(other == first for other in others)


def test_a_journal_folded_in_by_this_reader_is_not_parsed_again(
    tmp_path: Path, base_reads: list[Path]
) -> None:
    store = _new_batch(tmp_path)
    assert len(store.get_tasks(BATCH)) == TASKS
    journal = tmp_path / "tasks" / f"{BATCH}.journal"
    summary = "a long verdict " * 40  # one change of every task outgrows the base
    store.update_tasks(
        BATCH,
        {
            f"t{n}": {"status": TaskStatus.PASSED, "result": {"summary": summary}}
            for n in range(1, 401)
        },
    )
    assert not journal.exists()  # folded in, from the tasks kept parsed
    read = store.get_tasks(BATCH)
    assert len(base_reads) == 1 and read[399].result is not None
    assert read == _as_read_afresh(tmp_path)
    assert store.tasks.read(BATCH) == [t.model_dump(mode="json") for t in read]


def test_the_least_recently_read_batches_go_past_the_limit(
    tmp_path: Path, base_reads: list[Path]
) -> None:
    """Three batches of 400 under a limit of 1,000: reading the third drops the first
    (least recently read), the second stays; a batch bigger than the limit alone is kept."""
    store = _new_batch(tmp_path)
    for other in ("b2", "b3"):
        store.tasks.create(other, [{**row, "batch_id": other} for row in _rows(store)])
    store.parsed_tasks.limit = 1000
    for batch_id in (BATCH, "b2", "b3", "b2"):
        assert store.get_tasks(batch_id) is not None
    assert len(base_reads) == 3  # b2 read again from the cache
    store.get_tasks(BATCH)
    assert len(base_reads) == 4  # dropped when b3 came in (b3 goes now: b2 was read since)
    store.parsed_tasks.limit = 100
    store.get_tasks("b3")
    store.get_tasks("b3")
    assert len(base_reads) == 5  # b3 parsed once: kept alone while bigger than the limit
    store.get_tasks("b2")
    assert len(base_reads) == 6  # b2 went to make room


def _rows(store: TinyDBStore) -> list[dict[str, object]]:
    return [dump(task) for task in store.get_tasks(BATCH) or []]


def test_a_catch_up_of_many_changes_gives_the_tasks_as_read_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up makes models a few tasks at a time (MERGED_TASKS, made small here): a
    task changed again after its model was made gets its later values, as a fresh read."""
    monkeypatch.setattr("dropbox_eval.store.taskcache.MERGED_TASKS", 7)
    monkeypatch.setattr("dropbox_eval.store.tasks.BLOCK", 100)  # lines straddle blocks
    store = _new_batch(tmp_path)
    other = TinyDBStore(tmp_path)  # its lines are caught up at the next read
    assert len(store.get_tasks(BATCH)) == TASKS
    for first in range(1, TASKS, 20):  # a page of results, then some of them again
        other.update_tasks(
            BATCH, {f"t{n}": opened(n, f"http://f/{n}") for n in range(first, first + 20)}
        )
        other.update_tasks(BATCH, {f"t{first + 3}": {"status": TaskStatus.MISSING}})
    read = store.get_tasks(BATCH)
    assert read == _as_read_afresh(tmp_path)
    assert read[3].status == TaskStatus.MISSING and read[4].issue_number == 5


def test_a_readers_own_writes_reach_its_tasks_without_reading_the_journal_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A results visit writes a page of results at a time and reads the batch at its end:
    the kept tasks take each line as it is written, so that read has nothing to catch up;
    a line another process wrote in between is caught up from the journal as before."""
    store = _new_batch(tmp_path)
    store.get_tasks(BATCH)  # kept
    parsed: list[bytes] = []
    real = files.parse_line

    def counted(line: bytes) -> dict[str, object] | None:
        if line:
            parsed.append(line)
        return real(line)

    monkeypatch.setattr("dropbox_eval.store.tasks.parse_line", counted)
    for page in range(5):
        store.update_tasks(
            BATCH,
            {f"t{n}": opened(n, f"http://f/{n}") for n in range(page * 50 + 1, page * 50 + 51)},
        )
    assert store.get_tasks(BATCH)[249].issue_number == 250
    assert parsed == []  # nothing read back from the journal
    TinyDBStore(tmp_path).update_tasks(BATCH, {"t1": {"status": TaskStatus.MISSING}})
    store.update_tasks(BATCH, {"t2": {"status": TaskStatus.MISSING}})  # not next to its own
    assert [t.status for t in store.get_tasks(BATCH)[:3]] == [
        TaskStatus.MISSING,
        TaskStatus.MISSING,
        TaskStatus.OPEN,
    ]
    assert parsed  # the other process's line was read from the journal
    assert store.get_tasks(BATCH) == _as_read_afresh(tmp_path)


def test_a_write_reaches_the_kept_tasks_as_other_readers_read_it(tmp_path: Path) -> None:
    """What the journal keeps of a value is what the kept tasks take: a NaN in a lane's
    details is written as null, so the writer's own tasks say null too, not NaN."""
    store = _new_batch(tmp_path)
    store.get_tasks(BATCH)
    details = {"score": float("nan"), "ok": True}
    store.update_tasks(BATCH, {"t1": {"result": {"summary": "s", "details": details}}})
    mine = store.get_tasks(BATCH)[0].result
    assert mine is not None and mine.details == {"score": None, "ok": True}
    assert store.get_tasks(BATCH) == _as_read_afresh(tmp_path)
