"""Dropped files end in accepted/ or rejected/ with a receipt or an actionable error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import read_json, tasks
from helpers import drop

from dropbox_eval.app import App
from dropbox_eval.inbox import ReadinessTracker, is_candidate_name
from dropbox_eval.sandbox import SandboxForge


def test_accepted_file_moves_with_receipt(app: App, forge: SandboxForge, funded: str) -> None:
    raw = json.dumps({"client_id": funded, "tasks": tasks(2)}).encode()
    path = drop(app.inbox.root, "nightly.json", raw)
    outcome = app.inbox.process(path)
    assert outcome.status == "accepted"
    moved = app.inbox.root / "accepted" / "nightly.json"
    assert moved.read_bytes() == raw and not path.exists()
    receipt = read_json(app.inbox.root / "accepted" / "nightly.json.receipt.json")
    assert receipt["batch_id"] == outcome.document["batch_id"]
    # the receipt as soon as the batch and its hold are durable; issue numbers follow
    assert (receipt["status"], receipt["task_count"], receipt["held"]) == ("in_progress", 2, 4)
    assert [i["issue_number"] for i in receipt["issues"]] == [None, None]
    opened = app.store.get_tasks(receipt["batch_id"])  # no service: opened before returning
    assert (
        all(t.issue_number for t in opened) and len(forge.issues(*opened[0].repo.split("/"))) == 2
    )
    batch = app.store.get_batch(receipt["batch_id"])
    assert batch.filed and batch.intake_done  # filed after the receipt, then opened
    import hashlib

    assert receipt["sha256"] == hashlib.sha256(raw).hexdigest()


def test_a_kill_after_the_receipt_leaves_a_batch_the_next_visit_opens_once(
    app: App, forge: SandboxForge, funded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(*_: Any) -> None:
        raise SystemExit("killed")  # dies after the receipt and the move, before the write

    monkeypatch.setattr(type(app.intake), "filed", killed)
    path = drop(app.inbox.root, "k.json", {"client_id": funded, "tasks": tasks(3)})
    with pytest.raises(SystemExit):
        app.inbox.process(path)
    monkeypatch.undo()
    receipt = read_json(app.inbox.root / "accepted" / "k.json.receipt.json")
    batch = app.store.get_batch(receipt["batch_id"])
    assert not batch.filed and not batch.intake_done and not batch.open_started
    forge.clear_requests()
    assert app.intake.open_issues(batch.batch_id) == 3  # the service's next visit
    # no attempt had begun: nothing to adopt, so no listing before the creates
    assert [r.method for r in forge.requests][-3:] == ["POST"] * 3
    assert not any(r.method == "GET" and "/issues" in r.path for r in forge.requests)
    assert app.store.get_batch(batch.batch_id).intake_done
    assert app.intake.open_issues(batch.batch_id) == 0  # and once only
    numbers = [t.issue_number for t in app.store.get_tasks(batch.batch_id)]
    assert sorted(numbers) == [1, 2, 3]  # type: ignore[type-var]


def test_per_client_folder_sets_client_and_refuses_another(app: App, funded: str) -> None:
    app.billing.add_client("other", 100)
    ok = app.inbox.process(drop(app.inbox.root, "a.json", {"tasks": tasks(1)}, "acme"))
    assert ok.status == "accepted"
    assert app.store.get_batch(ok.document["batch_id"]).client_id == "acme"
    assert (app.inbox.root / "acme" / "accepted" / "a.json").exists()
    bad = app.inbox.process(
        drop(app.inbox.root, "b.json", {"client_id": "other", "tasks": tasks(1)}, "acme")
    )
    assert bad.status == "rejected"
    error = read_json(app.inbox.root / "acme" / "rejected" / "b.json.error.json")
    assert error["ok"] is False and error["reason"] == "client_mismatch"
    assert app.billing.client("other").balance == 100


@pytest.mark.parametrize(
    ("content", "reason", "field"),
    [
        (b'{"client_id": "acme", "tasks": [', "invalid_json", None),
        (b"", "invalid_json", None),
        (b"\xff\xfe{}", "invalid_encoding", None),
        (b"[1, 2]", "invalid_batch", "(document)"),
        ({"client_id": "acme", "tasks": []}, "invalid_batch", "tasks"),
        ({"client_id": "acme", "tasks": tasks(1), "colour": "red"}, "invalid_batch", "colour"),
        (
            {"client_id": "acme", "tasks": [{"task_id": "a/b", "title": "x"}]},
            "invalid_batch",
            "tasks.0.task_id",
        ),
        (
            {"client_id": "acme", "tasks": [{"task_id": "a..b", "title": "x"}]},
            "invalid_batch",
            "tasks.0.task_id",
        ),
        ({"client_id": "acme", "tasks": tasks(1) + tasks(1)}, "invalid_batch", "tasks"),
        (
            {"client_id": "acme", "tasks": [{"task_id": "t", "title": "x" * 256}]},
            "invalid_batch",
            "tasks.0.title",
        ),
        ({"tasks": tasks(1)}, "missing_client_id", "client_id"),
        ({"client_id": "ghost", "tasks": tasks(1)}, "unknown_client", None),
        ({"client_id": "acme", "tasks": tasks(51)}, "unfunded", None),
    ],
)
def test_bad_files_are_rejected_with_reason(
    app: App, forge: SandboxForge, funded: str, content: Any, reason: str, field: str | None
) -> None:
    forge.clear_requests()
    path = drop(app.inbox.root, "bad.json", content)
    original = path.read_bytes()
    outcome = app.inbox.process(path)
    assert outcome.status == "rejected"
    error = read_json(app.inbox.root / "rejected" / "bad.json.error.json")
    assert error["reason"] == reason
    assert error["message"]
    if field is not None:
        assert error["field"] == field
    assert (app.inbox.root / "rejected" / "bad.json").read_bytes() == original
    assert forge.requests == []


def test_same_bytes_twice_make_one_batch(app: App, funded: str) -> None:
    raw = json.dumps({"client_id": funded, "tasks": tasks(1)}).encode()
    first = app.inbox.process(drop(app.inbox.root, "x.json", raw))
    second = app.inbox.process(drop(app.inbox.root, "x.json", raw))
    assert second.document["batch_id"] == first.document["batch_id"]
    assert second.document["duplicate"] is True
    assert (app.inbox.root / "accepted" / "x.1.json").exists()
    assert len(app.store.list_batches()) == 1
    assert app.billing.client(funded).available == 98


def test_symlink_is_refused_and_target_untouched(app: App, funded: str, tmp_path: Path) -> None:
    target = tmp_path / "secret.json"
    target.write_text(json.dumps({"client_id": funded, "tasks": tasks(1)}))
    link = app.inbox.root / "link.json"
    link.symlink_to(target)
    outcome = app.inbox.process(link)
    assert outcome.status == "rejected" and outcome.document["reason"] == "symlink"
    assert target.exists() and (app.inbox.root / "rejected" / "link.json").is_symlink()


def test_candidate_names_skip_hidden_temporary_and_outcome_folders(tmp_path: Path) -> None:
    root = tmp_path
    assert is_candidate_name(root, root / "a.json")
    assert is_candidate_name(root, root / "acme" / "a.json")
    for name in (
        ".a.json",
        "a.json.filepart",
        "a.json.part",
        ".a.json.Xy12Ab",
        "a.txt",
        "accepted/a.json",
        "rejected/a.json",
        "acme/accepted/a.json",
        "x/y/z.json",
    ):
        assert not is_candidate_name(root, root / name), name


def test_readiness_waits_for_quiet_period(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text("{")
    tracker = ReadinessTracker(quiet_period=1.0)
    tracker.touch(path)
    assert list(tracker.ready(now=100.0)) == []
    assert list(tracker.ready(now=100.5)) == []
    with path.open("a") as handle:
        handle.write("}")
    os.utime(path, ns=(1, 1))
    assert list(tracker.ready(now=101.2)) == []  # changed: the clock restarts
    assert list(tracker.ready(now=102.3)) == [path]
    assert tracker.pending() == 0


def test_a_file_name_that_is_not_utf8_is_rejected_before_anything_is_created(
    app: App, funded: str
) -> None:
    folder = os.fsencode(app.inbox.root / funded)
    os.makedirs(folder, exist_ok=True)
    raw = os.path.join(folder, b"\xff\xfebad.json")
    with open(raw, "wb") as handle:
        handle.write(json.dumps({"tasks": tasks(1)}).encode())
    path = app.inbox.root / funded / os.fsdecode(b"\xff\xfebad.json")
    outcome = app.inbox.process(path)
    assert outcome.status == "rejected" and outcome.document["reason"] == "invalid_name"
    assert app.store.list_batches() == [] and app.billing.client(funded).held == 0
    assert not os.path.exists(raw)
