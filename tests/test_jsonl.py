"""JSON Lines batches and reports: a `*.jsonl` drop (one task per line, an optional first
line `{"batch": {...}}`) is taken like its JSON twin and its report comes as
`outbox/<batch_id>.jsonl` too; the API takes and answers JSON Lines by media type; hostile
lines are refused with an error file naming the line. Real inbox, service and forge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from conftest import read_json, served, serving, tasks, wait_for
from helpers import drop, finish_issues, receipt_of

from dropbox_eval.app import App
from dropbox_eval.errors import BatchRejected
from dropbox_eval.inbox.validation import check_file
from dropbox_eval.ops.retention import Retention
from dropbox_eval.protocol.batchlines import parse_batch_lines
from dropbox_eval.sandbox import SandboxForge

LIMITS = {"max_bytes": 1 << 20, "max_tasks": 5}


def lines(*documents: object) -> bytes:
    """One JSON document per line."""
    return b"".join(json.dumps(d).encode() + b"\n" for d in documents)


def test_a_jsonl_drop_is_taken_and_reported_as_json_lines_too(
    app: App, funded: str, forge: SandboxForge
) -> None:
    header = {"batch": {"batch_ref": "nightly", "completion_window": "2h"}}
    raw = lines(header, *tasks(3))
    with serving(app):
        dropped = drop(app.settings.inbox_path, "nightly.jsonl", raw, funded)
        assert wait_for(receipt_of(dropped).exists)
        batch_id = read_json(receipt_of(dropped))["batch_id"]
        batch = app.store.get_batch(batch_id)
        assert (batch.batch_ref, batch.total) == ("nightly", 3)
        assert batch.deadline is not None
        assert (batch.deadline - batch.created_at).total_seconds() == 7200
        assert wait_for(lambda: app.store.get_batch(batch_id).intake_done)
        finish_issues(forge, batch.repo)
        report = app.settings.outbox_path / f"{batch_id}.json"
        assert wait_for(report.exists)
    as_json = read_json(report)
    first, *rest = [
        json.loads(line) for line in report.with_suffix(".jsonl").read_text().splitlines()
    ]
    assert first == {"batch": {k: v for k, v in as_json.items() if k != "results"}}
    assert rest == as_json["results"]
    assert [line["task_id"] for line in rest] == ["t1", "t2", "t3"]
    assert list(rest[0])[:2] == ["task_id", "status"]  # a reader sees the task first


@pytest.mark.parametrize(
    ("raw", "reason", "line"),
    [
        (lines({"task_id": "a", "title": "A"}, {"task_id": "b"}), "invalid_batch", 2),
        (b'{"task_id":"a","title":"A"}\n{"task_id":"b",', "invalid_json", 2),
        (b'{"task_id":"a","title":"A","title":"B"}\n', "invalid_json", 1),
        (b'{"task_id":"a","title":"\\ud800"}\n', "invalid_encoding", 1),
        (lines({"task_id": "a", "title": "A"}, {"task_id": "a", "title": "B"}), "invalid_batch", 2),
        (lines({"task_id": "a", "title": "A"}, {"batch": {"batch_ref": "x"}}), "invalid_batch", 2),
        (
            lines({"batch": {"batch_ref": "no spaces"}}, {"task_id": "a", "title": "A"}),
            "invalid_batch",
            1,
        ),
        (lines({"batch": {"tasks": []}}), "invalid_batch", 1),
        (b'{"task_id":"a","title":"A"}\n[1, 2]\n', "invalid_batch", 2),
        (b'{"task_id":"a","title":"A"}\n\xff\n', "invalid_encoding", None),
    ],
)
def test_a_hostile_line_is_refused_by_its_number(raw: bytes, reason: str, line: int | None) -> None:
    with pytest.raises(BatchRejected) as refused:
        parse_batch_lines(raw, **LIMITS)
    assert refused.value.reason == reason
    assert refused.value.details.get("line") == line
    if line is not None:
        assert refused.value.message.startswith(f"line {line}")


def test_too_many_lines_or_none_at_all_are_refused() -> None:
    many = lines(*({"task_id": f"t{i}", "title": "T"} for i in range(6)))
    with pytest.raises(BatchRejected, match="6 tasks; the limit is 5"):
        parse_batch_lines(many, **LIMITS)
    with pytest.raises(BatchRejected, match="no task line"):
        parse_batch_lines(b"\n\r\n", **LIMITS)
    crlf = parse_batch_lines(
        b'{"task_id":"a","title":"A"}\r\n\r\n{"task_id":"b","title":"B"}', **LIMITS
    )
    assert [t.task_id for t in crlf.tasks] == ["a", "b"]


def test_a_hostile_jsonl_drop_gets_an_error_file_naming_its_line(app: App, funded: str) -> None:
    raw = lines({"task_id": "a", "title": "A"}, {"task_id": "b", "title": ""})
    with serving(app):
        dropped = drop(app.settings.inbox_path, "bad.jsonl", raw, funded)
        error = dropped.parent / "rejected" / "bad.jsonl.error.json"
        assert wait_for(error.exists)
    found = read_json(error)
    assert (found["reason"], found["line"], found["field"]) == ("invalid_batch", 2, "tasks.1.title")
    assert (dropped.parent / "rejected" / "bad.jsonl").read_bytes() == raw  # nothing lost


def test_validate_reads_jsonl_as_the_inbox_does(tmp_path: Path, app: App) -> None:
    good = tmp_path / "good.jsonl"
    good.write_bytes(lines({"batch": {"client_id": "acme"}}, *tasks(2)))
    bad = tmp_path / "bad.ndjson"
    bad.write_bytes(lines(*tasks(1), {"title": "no id"}))
    assert check_file(good, app.settings, None).task_count == 2
    verdict = check_file(bad, app.settings, "acme")
    assert verdict.error is not None and verdict.error.details["line"] == 2


def test_the_api_takes_and_answers_json_lines(app: App, funded: str, forge: SandboxForge) -> None:
    auth = {"Authorization": f"Bearer {app.billing.new_api_key(funded)}"}
    with served(app) as url, serving(app):
        posted = requests.post(
            f"{url}/api/eval/batches",
            data=lines({"batch": {"batch_ref": "api-lines"}}, *tasks(2)),
            headers={**auth, "Content-Type": "application/x-ndjson"},
            timeout=30,
        )
        assert posted.status_code == 201, posted.text
        batch_id = posted.json()["batch_id"]
        assert wait_for(lambda: app.store.get_batch(batch_id).intake_done)
        finish_issues(forge, app.store.get_batch(batch_id).repo)
        assert wait_for(lambda: app.store.get_batch(batch_id).status != "running")
        route = f"{url}/api/eval/batches/{batch_id}/report"
        streamed = requests.get(route, headers={**auth, "Accept": "application/jsonl"}, timeout=30)
        answer = requests.get(route, headers=auth, timeout=30)
        whole = answer.json()
    outbox_file = app.settings.outbox_path / f"{batch_id}.json"
    assert answer.content == outbox_file.read_bytes()  # copied from the store in blocks
    assert answer.headers["content-length"] == str(len(answer.content))
    assert streamed.headers["content-type"].startswith("application/x-ndjson")
    first, *rest = [json.loads(line) for line in streamed.text.splitlines()]
    assert first["batch"]["batch_ref"] == "api-lines" and rest == whole["results"]


def test_delete_removes_a_json_lines_drop_and_both_reports(
    app: App, funded: str, forge: SandboxForge
) -> None:
    inbox, outbox = app.settings.inbox_path, app.settings.outbox_path
    first = drop(inbox, "run.ndjson", lines({"batch": {"batch_ref": "one"}}, *tasks(1)), funded)
    app.inbox.process(first)
    second = drop(inbox, "run.ndjson", lines({"batch": {"batch_ref": "two"}}, *tasks(1)), funded)
    app.inbox.process(second)  # the name is taken in accepted/: filed as run.1.ndjson
    accepted = first.parent / "accepted"
    batch_id = read_json(accepted / "run.1.ndjson.receipt.json")["batch_id"]
    app.intake.open_issues(batch_id)
    finish_issues(forge, app.store.get_batch(batch_id).repo)
    app.poller.poll_completed(batch_id, full=True)
    app.delivery.emit(batch_id)
    reports = [outbox / f"{batch_id}.json", outbox / f"{batch_id}.jsonl"]
    assert all(path.is_file() for path in reports)
    Retention(app.store, app.billing, app.settings).delete(batch_id)
    assert not any(path.exists() for path in reports)
    assert sorted(p.name for p in accepted.iterdir()) == ["run.ndjson", "run.ndjson.receipt.json"]
