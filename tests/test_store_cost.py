"""Store cost follows the change and the page, not the batch size or the history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tasks
from helpers import finish_issues

from dropbox_eval.app import App
from dropbox_eval.models import TaskStatus
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.engine import TinyDBStore

pytestmark = pytest.mark.tinydb_files  # the TinyDB engine's files: what a change writes and fsyncs


def _finish_all(app: App, forge: SandboxForge, batch_id: str) -> None:
    finish_issues(forge, app.store.get_batch(batch_id).repo)
    app.poller.poll_completed(batch_id, full=True)
    app.delivery.emit(batch_id)


def test_a_task_change_appends_one_line_instead_of_rewriting_the_batch(
    app: App, funded: str
) -> None:
    app.billing.fund(funded, 1000)
    batch_id = app.intake.submit_batch(funded, tasks(300))["batch_id"]
    base = app.settings.state_path / "tasks" / f"{batch_id}.json"
    journal = base.with_suffix(".journal")
    before = base.stat()
    journal_size = journal.stat().st_size if journal.exists() else 0
    app.store.update_tasks(batch_id, {"t7": {"status": TaskStatus.MISSING}})
    assert base.stat().st_mtime_ns == before.st_mtime_ns  # the base is not rewritten
    assert journal.stat().st_size - journal_size < 200
    statuses = {t.task_id: t.status for t in app.store.get_tasks(batch_id)}
    assert statuses["t7"] == TaskStatus.MISSING and statuses["t8"] == TaskStatus.OPEN


def test_the_journal_is_folded_in_once_it_outgrows_the_base(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    store.tasks.create("b1", [{"task_id": f"t{i}", "status": "open"} for i in range(3)])
    for n in range(2000):
        store.tasks.append("b1", {"t1": {"note": "x" * 40, "n": n}})
    journal = tmp_path / "tasks" / "b1.journal"
    assert not journal.exists() or journal.stat().st_size < 70_000
    assert [d.get("n") for d in store.tasks.read("b1")] == [None, 1999, None]


def test_a_crash_during_compaction_loses_nothing(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    store.tasks.create("b1", [{"task_id": "t1", "v": 0}, {"task_id": "t2", "v": 0}])
    store.tasks.append("b1", {"t1": {"v": 1}})
    store.tasks.append("b1", {"t1": {"v": 2}, "t2": {"v": 5}})
    journal = (tmp_path / "tasks" / "b1.journal").read_bytes()
    store.tasks.compact("b1")
    (tmp_path / "tasks" / "b1.journal").write_bytes(journal)  # killed before the unlink
    store.tasks.append("b1", {"t2": {"v": 6}})
    assert [d["v"] for d in store.tasks.read("b1")] == [2, 6]


def test_another_process_s_change_is_seen_despite_the_cache(app: App, funded: str) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    assert app.store.get_tasks(batch_id)[0].status == TaskStatus.OPEN  # now cached
    other = TinyDBStore(app.settings.state_path)  # another process's view of the same folder
    other.update_tasks(batch_id, {"t1": {"status": TaskStatus.MISSING}})
    assert app.store.get_tasks(batch_id)[0].status == TaskStatus.MISSING


def test_emitted_batches_leave_the_live_folders_and_listings_page_from_the_end(
    app: App, forge: SandboxForge, funded: str
) -> None:
    ids = [
        app.intake.submit_batch(funded, tasks(1), batch_ref=f"r{n}")["batch_id"] for n in range(6)
    ]
    for batch_id in ids[:5]:
        _finish_all(app, forge, batch_id)
    state = app.settings.state_path
    assert sorted(p.stem for p in (state / "batches").glob("*.json")) == [ids[5]]
    assert sorted(p.stem for p in (state / "tasks").glob("*.json")) == [ids[5]]
    assert app.store.get_batch(ids[0]).status == "emitted"  # still found, in the archive
    assert [t.status for t in app.store.get_tasks(ids[0])] == [TaskStatus.PASSED]
    page = app.store.page_batches(client_id=funded, limit=3)
    assert [r.batch_id for r in page] == [ids[5], ids[4], ids[3]]
    second = app.store.page_batches(client_id=funded, limit=3, offset=3)
    assert [r.batch_id for r in second] == [ids[2], ids[1], ids[0]]
    assert app.store.count_batches(funded) == {"emitted": 5, "running": 1}
    newest = app.store.ledger(funded, limit=2)
    assert [(e.kind, e.batch_id) for e in newest] == [("charge", ids[4]), ("release", ids[4])]
    assert len(app.store.ledger(funded)) == 1 + 6 + 5 * 2  # fund, holds, charge+release


def test_a_page_reads_only_the_end_of_a_long_archive(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    history = tmp_path / "archive" / "clients" / "acme" / "batches.jsonl"
    history.parent.mkdir(parents=True)
    row = {
        "client_id": "acme",
        "status": "emitted",
        "total": 1,
        "repo": "acme/r",
        "created_at": "2026-01-01T00:00:00Z",
    }
    with history.open("w") as handle:
        for n in range(50_000):
            handle.write(json.dumps({**row, "batch_id": f"b{n:06d}"}) + "\n")
    taken: list[str] = []
    newest = store.archive_rows.newest_batches

    def counted(client_id: str | None = None) -> Iterator[dict[str, Any]]:
        for row in newest(client_id):
            taken.append(row["batch_id"])
            yield row

    store.archive_rows.newest_batches = counted  # type: ignore[method-assign]
    page = store.page_batches(client_id="acme", limit=20, offset=20)
    assert [r.batch_id for r in page][:2] == ["b049979", "b049978"]
    assert len(taken) == 40  # the rows of the page and the ones skipped, no more


def test_a_new_batch_costs_two_round_trips_before_its_first_issue(
    app: App, forge: SandboxForge, funded: str
) -> None:
    app.intake.submit_batch(funded, tasks(1), batch_ref="warm")  # the token's login, once
    forge.clear_requests()
    app.intake.submit_batch(funded, tasks(3), batch_ref="second")
    calls = [(r.method, r.path.split("/api/v1")[1]) for r in forge.requests]
    first_issue = next(i for i, c in enumerate(calls) if c[1].endswith("/issues"))
    assert [method for method, _ in calls[:first_issue]] == ["POST", "POST"]
    assert calls[0][1] == "/user/repos" and calls[1][1].endswith("/labels")
