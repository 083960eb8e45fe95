"""The published JSON Schemas: generated from the models, shipped in the
package, printed by `dropbox-eval schema`, and met by every document the service writes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import forkrun
import jsonschema_rs
import pytest
from conftest import SCHEMAS, read_json, schema_problems, tasks
from helpers import drop
from pydantic import ValidationError

from dropbox_eval.app import App
from dropbox_eval.protocol.documents import BatchReceipt, issue_list
from dropbox_eval.schemas import DIALECT, NAMES, rendered, shipped

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_schema_is_what_its_model_generates_now(name: str) -> None:
    assert shipped(name) == rendered(name), (
        f"dropbox_eval/schemas/{name}.json is stale: run `python -m dropbox_eval.schemas --write`"
    )


@pytest.mark.parametrize("name", NAMES)
def test_schema_command_prints_a_draft_2020_12_schema(name: str) -> None:
    done = forkrun.run(["schema", name])
    assert done.returncode == 0, done.stderr
    assert done.stdout == shipped(name)
    schema = json.loads(done.stdout)
    assert schema["$schema"] == DIALECT == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"urn:dropbox-eval:schema:{name}" and schema["title"]
    assert jsonschema_rs.meta.is_valid(schema)


def test_schema_command_refuses_an_unknown_document() -> None:
    done = forkrun.run(["schema", "invoice"])
    assert done.returncode == 2 and "'batch', 'receipt', 'error', 'report'" in done.stderr


def test_a_build_of_the_package_carries_the_schemas(tmp_path: Path) -> None:
    """What `pip install .` installs (setuptools' build step, from pyproject's package-data)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "dropbox_eval", source / "dropbox_eval")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = tmp_path / "built"
    done = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py"]
        + ["--build-lib", str(built)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in NAMES:
        assert (built / "dropbox_eval" / "schemas" / f"{name}.json").read_text() == shipped(name)


SHAPE_ERRORS = (
    "unknown-field",
    "no-tasks",
    "bad-task-id",
    "title-too-long",
    "control-character",
    "not-an-object",
    "several-problems",
)
"""Invalid examples whose fault is in their shape: the batch schema alone catches them."""


def test_the_batch_schema_takes_the_valid_examples_and_refuses_shape_errors() -> None:
    for path in sorted((EXAMPLES / "valid").glob("*.json")):
        assert SCHEMAS["batch"].is_valid(read_json(path)), path
    for name in SHAPE_ERRORS:
        assert not SCHEMAS["batch"].is_valid(read_json(EXAMPLES / "invalid" / f"{name}.json"))


def _drop(app: App, name: str, data: bytes, client: str | None = None) -> Path:
    """Drop a file and let the inbox take it; where it went."""
    outcome = app.inbox.process(drop(app.settings.inbox_path, name, data, client))
    assert outcome.path is not None, outcome
    return outcome.path


def test_every_kind_of_document_meets_its_schema(app: App, funded: str, tmp_path: Path) -> None:
    """Each variant of each document, checked here by name (the conftest check covers the
    rest of the suite): a receipt, a duplicate's filed under another name, a cancel's; error
    files with each kind of detail; a report."""
    app.billing.add_client("broke", 0)
    batch = json.dumps({"batch_ref": "r1", "tasks": tasks(2)}).encode()
    first = _drop(app, "x.json", batch, "acme")
    again = _drop(app, "x.json", batch, "acme")
    batch_id = read_json(first.parent / "x.json.receipt.json")["batch_id"]
    assert read_json(again.parent / "x.1.json.receipt.json")["filed_as"] == "x.1.json"
    _drop(app, f"cancel-{batch_id}.json", b"{}", "acme")
    _drop(app, f"cancel-{batch_id}.json", b"{}", "acme")  # already cancelled: a receipt too
    _drop(app, "cancel-nothing.json", b"{}", "acme")
    _drop(app, "poor.json", json.dumps({"tasks": tasks(1)}).encode(), "broke")
    _drop(app, "latin1.json", b'{"tasks": [{"task_id": "t1", "title": "caf\xe9"}]}', "acme")
    _drop(app, "cut.json", b'{"tasks": [', "acme")
    _drop(app, "shape.json", json.dumps({"tasks": [{"task_id": "a b"}]}).encode(), "acme")
    errors = {p.name: read_json(p) for p in tmp_path.rglob("*.error.json")}
    assert errors["poor.json.error.json"]["available"] == 0  # a zero detail is written
    assert errors["latin1.json.error.json"]["byte"] == 42
    assert errors["cut.json.error.json"]["line"] == 1
    assert errors["cancel-nothing.json.error.json"]["reason"] == "unknown_batch"
    assert len(errors["shape.json.error.json"]["errors"]) == 2
    receipts = [read_json(p) for p in tmp_path.rglob("*.receipt.json")]
    assert sum(1 for r in receipts if r.get("cancel")) == 2
    assert any(r.get("duplicate") for r in receipts)
    app.delivery.emit(batch_id)
    reports = list(app.settings.outbox_path.glob("*.json"))
    assert [read_json(p)["status"] for p in reports] == ["cancelled"]
    assert schema_problems(tmp_path) == []


@pytest.mark.planted_documents
def test_the_schema_check_reports_a_document_that_drifted(tmp_path: Path) -> None:
    accepted, outbox = tmp_path / "inbox" / "accepted", tmp_path / "outbox"
    accepted.mkdir(parents=True)
    outbox.mkdir()
    receipt = {
        "ok": True,
        "batch_id": "20261201-000000-000abcdef",
        "status": "in_progress",
        "task_count": 1,
        "held": 1,
        "issues": [{"task_id": "t1", "issue_number": None}],
        "client_id": "acme",
        "sha256": "0" * 64,
        "file": "x.json",
        "accepted_at": "2026-12-01T00:00:00Z",
    }
    (accepted / "x.json.receipt.json").write_text(json.dumps(receipt))
    assert schema_problems(tmp_path) == []
    (accepted / "y.json.receipt.json").write_text(json.dumps({**receipt, "priority": 1}))
    (outbox / "20261201-000000-000abcdef.json").write_text(json.dumps({"batch_id": "b"}))
    problems = schema_problems(tmp_path)
    assert {p.split(": ", 1)[0] for p in problems} == {
        str(accepted / "y.json.receipt.json"),
        str(outbox / "20261201-000000-000abcdef.json"),
    }
    assert any("the receipt schema refuses" in p for p in problems)
    assert any("the report schema refuses" in p for p in problems)


def test_a_receipt_with_plain_issues_is_the_document_its_models_give() -> None:
    """A big batch's receipt keeps its issues as plain documents (documents.py
    `with_issues`): what it writes is what validating each one gives, and every other
    field is still validated."""
    fields = {
        "ok": True,
        "batch_id": "20261202-000000-000abc123",
        "status": "in_progress",
        "task_count": 2,
        "held": 2,
        "client_id": "acme",
        "sha256": "0" * 64,
        "file": "b.json",
        "accepted_at": "2026-12-02T00:00:00Z",
    }
    issues = issue_list({"a": None, "b": 7})
    plain = BatchReceipt.with_issues(issues, **fields).document()
    assert plain == BatchReceipt.model_validate({**fields, "issues": issues}).document()
    assert plain["issues"] == [
        {"task_id": "a", "issue_number": None},
        {"task_id": "b", "issue_number": 7},
    ]
    assert SCHEMAS["receipt"].is_valid(plain)
    with pytest.raises(ValidationError):
        BatchReceipt.with_issues(issues, **fields, surprise=1)
    with pytest.raises(ValidationError):
        BatchReceipt.with_issues(issues, **{**fields, "sha256": "not a digest"})
