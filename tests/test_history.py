"""The history: an archived batch is one entry in a shared segment, not files of its own;
pages cost the page whatever the overlap of batches in time; a cursor pages the history;
a tombstone replaces a batch; a state archived as two files per batch is still read."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import tasks as task_specs

from dropbox_eval.cli import main
from dropbox_eval.errors import NotFoundError
from dropbox_eval.models import BatchRecord, BatchStatus, TaskRecord, TaskSpec, TaskStatus, utcnow
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.files import write_table
from dropbox_eval.util import crashpoints


def _archived(store: TinyDBStore, n: int, *, client_id: str = "acme", tasks: int = 2) -> str:
    """A batch created an hour ago (before every other ended), passed, emitted: archived."""
    now = utcnow()
    created = now - timedelta(hours=1) + timedelta(seconds=n)
    batch_id = f"{created:%Y%m%d-%H%M%S}-{n:09d}"
    batch = BatchRecord(
        batch_id=batch_id, client_id=client_id, repo="o/r", total=tasks, created_at=created
    )
    spec = TaskSpec.model_validate(task_specs(1)[0])
    records = [
        TaskRecord(task_id=f"t{i}", batch_id=batch_id, repo="o/r", payload=spec, created_at=created)
        for i in range(tasks)
    ]
    with store.transaction() as tx:
        tx.record_batch(batch, records, None)
    store.update_tasks(batch_id, {f"t{i}": {"status": TaskStatus.PASSED} for i in range(tasks)})
    store.update_batch(batch_id, status=BatchStatus.EMITTED, done=tasks, completed_at=now)
    store.update_batch(batch_id, emitted_at=now)
    return batch_id


def _files(folder: Path) -> set[str]:
    """The files of a state folder but its lock files (a fixed set of stripes)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix != ".lock"}


def test_an_archived_batch_is_one_entry_and_stays_readable_and_changeable(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    first = _archived(store, 1)
    before = _files(tmp_path)
    ids = [_archived(store, n) for n in range(2, 12)]
    assert _files(tmp_path) == before  # ten more batches, not one more file
    assert not list((tmp_path / "batches").iterdir()) and not list((tmp_path / "tasks").iterdir())
    other = TinyDBStore(tmp_path)  # another process reads the same history
    assert other.get_batch(ids[3]).status == BatchStatus.EMITTED
    assert [t.status for t in other.get_tasks(ids[3])] == [TaskStatus.PASSED] * 2
    store.update_batch(first, retried_by="20990101-000000-abcdef123")  # a retry's link
    assert other.get_batch(first).retried_by == "20990101-000000-abcdef123"
    assert len(other.get_tasks(first)) == 2 and other.is_recorded(first)
    with pytest.raises(NotFoundError):
        other.get_batch("20260101-000000-000000000")


def test_a_page_reads_only_the_page_when_every_batch_overlapped_every_other(
    tmp_path: Path,
) -> None:
    store = TinyDBStore(tmp_path)
    ids = [_archived(store, n, tasks=1) for n in range(60)]
    taken: list[str] = []
    newest = store.archive_rows.newest_batches

    def counted(client_id: str | None = None) -> Iterator[dict[str, Any]]:
        for row in newest(client_id):
            taken.append(row["batch_id"])
            yield row

    store.archive_rows.newest_batches = counted  # type: ignore[method-assign]
    page = store.page_batches(limit=5, offset=5)
    assert [r.batch_id for r in page] == ids[::-1][5:10]  # newest ended first
    assert len(taken) == 10  # created an hour before any ended: still only the page read


def test_a_cursor_pages_the_history_and_a_tombstone_replaces_a_batch(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    ids = [_archived(store, n, tasks=1) for n in range(7)]
    first = store.history_page(limit=3)
    assert [r.batch_id for r in first.rows] == ids[6:3:-1]
    newer = _archived(store, 99, tasks=1)  # archived meanwhile: no page after it moves
    second = store.history_page(limit=3, cursor=first.next_cursor)
    assert [r.batch_id for r in second.rows] == ids[3:0:-1]
    assert store.bury_batch(ids[0], reason="retention") is True
    assert store.bury_batch(ids[0], reason="retention") is False  # buried already
    last = store.history_page(limit=3, cursor=second.next_cursor)
    assert last.rows == [] and last.next_cursor is None
    assert [r.batch_id for r in store.history_page(limit=1).rows] == [newer]
    with pytest.raises(NotFoundError):
        store.get_batch(ids[0])
    with pytest.raises(NotFoundError):
        store.get_tasks(ids[0])
    assert store.count_batches() == {"emitted": 7}
    assert ids[0] not in {r.batch_id for r in store.list_batches()}
    with pytest.raises(ValueError, match="not a history cursor"):
        store.history_page(cursor="20260101")


def test_a_state_archived_as_two_files_per_batch_is_still_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = TinyDBStore(home / "state")
    batch_id = _archived(store, 1)
    record, tasks = store.get_batch(batch_id), store.get_tasks(batch_id)
    month = home / "state" / "archive" / batch_id[:6]
    shutil.rmtree(month)  # the layout an older version left: two files, no history entry
    write_table(month / "batches" / f"{batch_id}.json", "batch", [record.model_dump(mode="json")])
    write_table(
        month / "tasks" / f"{batch_id}.json", "tasks", [t.model_dump(mode="json") for t in tasks]
    )
    old = TinyDBStore(home / "state")
    assert old.get_batch(batch_id) == record and old.get_tasks(batch_id) == tasks
    old.update_batch(batch_id, retried_by="20990101-000000-abcdef123")
    assert old.get_batch(batch_id).retried_by == "20990101-000000-abcdef123"
    assert [r.batch_id for r in old.page_batches()] == [batch_id]
    checked = CliRunner().invoke(main, ["--home", str(home), "check"])
    assert checked.exit_code == 0, checked.output


BURY = """
import sys
from pathlib import Path
from dropbox_eval.store.engine import TinyDBStore
TinyDBStore(Path(sys.argv[1])).bury_batch(sys.argv[2], reason="delete", keep={"kept": 1})
"""


def test_a_burial_cut_short_at_any_write_is_finished_by_burying_again(tmp_path: Path) -> None:
    kept = {"kept": 1}
    for crash_after in itertools.count(1):
        state = tmp_path / str(crash_after)
        store = TinyDBStore(state)
        batch_id, other = _archived(store, 1), _archived(store, 2)
        env = {**os.environ, crashpoints.ENV: f"bury:{crash_after}"}
        done = subprocess.run(
            [sys.executable, "-c", BURY, str(state), batch_id], env=env, capture_output=True
        )
        store = TinyDBStore(state)  # as a restarted process sees it
        if done.returncode == 0:  # no write left to cut: every crash point was walked
            assert store.bury_batch(batch_id, reason="delete", keep=kept) is False
            break
        assert done.returncode == -signal.SIGKILL, done.stderr
        store.bury_batch(batch_id, reason="delete", keep=kept)
        assert store.bury_batch(batch_id, reason="delete", keep=kept) is False
        assert store.tombstone(batch_id) == kept  # whole, never a bare one
        assert store.count_batches() == {"emitted": 1}  # uncounted once
        assert [r.batch_id for r in store.page_batches(limit=5)] == [other]
    assert crash_after > 3
