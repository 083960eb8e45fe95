"""A batch's report is fixed beside its record, not in it: reading or changing the record
never parses the report, which goes with the batch into the history; a record holding its
report (as older versions wrote it) still reads. The report is written task line by task
line, with the bytes `json.dumps(report, indent=2, sort_keys=True)` writes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from conftest import tasks as task_specs

from dropbox_eval.delivery.emitter import BLOCK, FileEmitter, FixedReport, report_bytes
from dropbox_eval.models import (
    BatchRecord,
    BatchStatus,
    PullRequestRef,
    TaskRecord,
    TaskResult,
    TaskSpec,
    TaskStatus,
    utcnow,
)
from dropbox_eval.protocol.report import (
    ReportPieces,
    build_report,
    canonical,
    in_client_order,
    report_batch_id,
    report_document,
)
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.files import read_table, write_table


def _running(store: TinyDBStore, count: int = 3) -> tuple[BatchRecord, list[TaskRecord]]:
    """A recorded batch whose tasks the lane has passed, not closed yet."""
    created = utcnow() - timedelta(minutes=5)
    batch = BatchRecord(
        batch_id=f"{created:%Y%m%d-%H%M%S}-000abc123",
        client_id="acme",
        repo="o/r",
        total=count,
        created_at=created,
    )
    spec = TaskSpec.model_validate(task_specs(1)[0])
    tasks = [
        TaskRecord(
            task_id=f"t{i}", batch_id=batch.batch_id, repo="o/r", payload=spec, created_at=created
        )
        for i in range(count)
    ]
    with store.transaction() as tx:
        tx.record_batch(batch, tasks, None)
    store.update_tasks(batch.batch_id, {t.task_id: {"status": TaskStatus.PASSED} for t in tasks})
    return batch, store.get_tasks(batch.batch_id)


def _closed(batch: BatchRecord) -> BatchRecord:
    return batch.model_copy(update={"status": BatchStatus.COMPLETED, "completed_at": utcnow()})


def test_the_report_is_kept_beside_the_record_and_goes_into_the_history(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    batch, tasks = _running(store)
    final = _closed(batch)
    report = report_document(final, tasks)
    store.update_batch(
        batch.batch_id, status=final.status, completed_at=final.completed_at, report=report
    )
    record = read_table(tmp_path / "batches" / f"{batch.batch_id}.json", "batch")[0]
    assert "report" not in record and record["status"] == "completed"
    assert store.get_report(batch.batch_id) == report
    assert json.loads(report)["counts"] == {"total": 3, "passed": 3, "failed": 0}

    store.update_batch(batch.batch_id, status=BatchStatus.EMITTED, emitted_at=utcnow())
    assert not (tmp_path / "reports" / f"{batch.batch_id}.json").exists()  # archived
    again = TinyDBStore(tmp_path)  # another process: from the history
    assert again.get_report(batch.batch_id) == report
    assert again.get_tasks(batch.batch_id) == tasks
    assert again.get_report("20990101-000000-000000000") is None


def test_a_record_holding_its_report_as_older_versions_wrote_it_still_reads(
    tmp_path: Path,
) -> None:
    store = TinyDBStore(tmp_path)
    batch, tasks = _running(store)
    final = _closed(batch)
    store.update_batch(batch.batch_id, status=final.status, completed_at=final.completed_at)
    assert store.get_report(batch.batch_id) is None  # none fixed: the caller builds one
    path = tmp_path / "batches" / f"{batch.batch_id}.json"
    legacy = build_report(final, tasks)
    write_table(path, "batch", [{**read_table(path, "batch")[0], "report": legacy}])

    assert store.get_batch(batch.batch_id).status == BatchStatus.COMPLETED
    assert store.get_report(batch.batch_id) == canonical(legacy)
    store.update_batch(batch.batch_id, status=BatchStatus.EMITTED, emitted_at=utcnow())
    assert TinyDBStore(tmp_path).get_report(batch.batch_id) == canonical(legacy)  # archived


def test_the_report_written_line_by_line_is_the_standard_librarys_bytes() -> None:
    now = utcnow()
    batch = _closed(
        BatchRecord(
            batch_id="20260101-000000-000abc123",
            client_id="acme",
            repo="o/r",
            total=1003,
            created_at=now,
            metadata={"run": "é\u2028"},
        )
    )
    spec = TaskSpec(task_id="t", title="t")
    odd = [
        TaskResult(summary="plain", details={"a": [1, {"b": None}], "c": {}}),
        TaskResult(summary="\x7f and é", summary_edited_after_settle=True),
        TaskResult(summary="x", details={"f": 1.5e16, "big": 2**70, "list": []}),
        TaskResult(
            summary="pr", pull_request=PullRequestRef(number=1, url="u", merged=True, merged_at=now)
        ),
    ]
    tasks = [  # more than one chunk of lines
        TaskRecord(
            task_id=f"t{i}",
            batch_id=batch.batch_id,
            repo="o/r",
            payload=spec,
            created_at=now,
            status=TaskStatus.PASSED if i % 2 else TaskStatus.FAILED,
            result=odd[i % len(odd)] if i < 1000 else None,
        )
        for i in range(1003)
    ]
    for some in (tasks, tasks[:1], []):
        report = build_report(batch, some)
        document = report_document(batch, some)
        assert document == (json.dumps(report, indent=2, sort_keys=True) + "\n").encode()
        assert canonical(report) == document
        assert report_batch_id(document) == batch.batch_id
        pieces = ReportPieces(batch, some)  # what the close writes, a chunk of lines at a time
        assert b"".join(pieces) == document == b"".join(pieces) == bytes(pieces)
        ordered = in_client_order(document)  # the order JSON Lines readers see
        assert ordered == report and list(ordered) == list(report)
        assert [list(line) for line in ordered["results"]] == [
            list(line) for line in report["results"]
        ]


def test_a_report_written_in_pieces_is_fixed_and_archived_as_its_bytes(tmp_path: Path) -> None:
    store = TinyDBStore(tmp_path)
    batch, tasks = _running(store, 7000)  # chunks of task lines, blocks of the copy
    final = _closed(batch)
    with store.transaction() as tx:  # as the close fixes it: in pieces, at the commit
        tx.update_batch(
            batch.batch_id,
            status=final.status,
            completed_at=final.completed_at,
            report=ReportPieces(final, tasks),
        )
    report = report_document(final, tasks)
    assert len(report) > 1 << 20  # the history copies it from its file block by block
    assert store.get_report(batch.batch_id) == report

    store.update_batch(batch.batch_id, status=BatchStatus.EMITTED, emitted_at=utcnow())
    assert not (tmp_path / "reports" / f"{batch.batch_id}.json").exists()  # archived
    assert TinyDBStore(tmp_path).get_report(batch.batch_id) == report


def test_a_fixed_report_of_many_blocks_reaches_the_outbox_byte_for_byte(tmp_path: Path) -> None:
    """Delivery copies the fixed report from the store a block at a time (emitter.py
    `FixedReport`): the outbox file is its bytes, however many blocks, and reading it again
    (a callback's body after a file copy) starts from its beginning."""
    store = TinyDBStore(tmp_path / "state")
    batch, tasks = _running(store)
    notes = {"notes": '\u00e9 "quoted" \\ ' * (BLOCK // 4)}  # 2.5 blocks, escaped
    final = _closed(batch).model_copy(update={"metadata": notes})
    report = report_document(final, tasks)
    store.write_report(batch.batch_id, report)
    handle = store.open_report(batch.batch_id)
    assert handle is not None
    with handle:
        fixed = FixedReport(batch.batch_id, handle)
        written = FileEmitter(tmp_path / "outbox").write(fixed)
        assert written.name == f"{batch.batch_id}.json" and written.read_bytes() == report
        assert len(report) > 2 * BLOCK and fixed.size() == len(report)
        assert report_bytes(fixed) == report == b"".join(fixed.blocks())
