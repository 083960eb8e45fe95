"""Hostile files in the inbox: a re-upload during intake, a marker inside task text, numbers
JSON cannot hold, names up to 255 bytes, a kill between receipt and move, litter left behind.

Each test failed on the code before its fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

import pytest
from conftest import PATIENCE, read_json, tasks, wait_for
from helpers import drop, finish_issues

from dropbox_eval.app import App, build_app
from dropbox_eval.config import Settings
from dropbox_eval.inbox import fsops
from dropbox_eval.models import BatchFile
from dropbox_eval.sandbox import SandboxForge


def _batch(ref: str, count: int = 2, **extra: Any) -> bytes:
    return json.dumps({"batch_ref": ref, "tasks": tasks(count), **extra}).encode()


def test_a_reupload_during_intake_stays_in_the_inbox_and_becomes_its_own_batch(
    app: App, forge: SandboxForge, funded: str
) -> None:
    first = _batch("first", 40)
    path = drop(app.inbox.root, "nightly.json", first, "acme")
    forge.set_delay(0.05)
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(app.inbox.process(path)))
    worker.start()
    assert wait_for(lambda: len(forge.requests) >= 5)  # issues are being created
    second = _batch("second", 1)
    part = path.with_name("nightly.json.part")
    part.write_bytes(second)
    os.rename(part, path)
    worker.join(PATIENCE)
    assert not worker.is_alive()
    forge.set_delay(0)
    accepted = path.parent / "accepted"
    receipt = read_json(accepted / "nightly.json.receipt.json")
    assert (accepted / "nightly.json").read_bytes() == first
    assert receipt["sha256"] == hashlib.sha256(first).hexdigest()
    assert path.read_bytes() == second  # the new upload is still waiting to be read
    again = app.inbox.process(path)
    assert again.status == "accepted" and again.document["batch_id"] != receipt["batch_id"]
    assert app.store.get_batch(again.document["batch_id"]).batch_ref == "second"
    assert (
        read_json(accepted / "nightly.1.json.receipt.json")["sha256"]
        == hashlib.sha256(second).hexdigest()
    )


def test_a_marker_inside_task_text_is_neither_adopted_nor_kept(
    settings: Settings, forge: SandboxForge
) -> None:
    shared = build_app(settings.model_copy(update={"repo": f"{forge.user}/shared"}))
    shared.billing.add_client("acme", 100)
    victim = BatchFile.model_validate({"tasks": tasks(1)})
    record = shared.intake.record(victim, "acme").batch  # interrupted before its issues
    spoof = {
        "tasks": [
            {
                "task_id": "x1",
                "title": "spoof",
                "body": f"<!-- dropbox-eval:task batch={record.batch_id} task=t1 -->",
            }
        ]
    }
    attacker = shared.intake.accept(BatchFile.model_validate(spoof), "acme")
    assert shared.intake.open_issues(record.batch_id) == 1  # its own issue, not the spoof
    victim_task = shared.store.get_tasks(record.batch_id)[0]
    assert victim_task.issue_number != attacker["issues"][0]["issue_number"]
    bodies = [issue["body"] for issue in forge.issues(forge.user, "shared")]
    assert sum(f"batch={record.batch_id} task=t1 -->" in body for body in bodies) == 2
    spoofed = next(b for b in bodies if "spoof" not in b and "&lt;!--" in b)
    assert spoofed.rstrip().splitlines()[-1].startswith("<!-- dropbox-eval:task batch=")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"client_id": "acme", "completion_window": ' + b"9" * 5000 + b', "tasks": []}',
        b'{"client_id": "acme", "completion_window": NaN, "tasks": []}',
        b'{"client_id": "acme", "completion_window": -Infinity, "tasks": []}',
    ],
    ids=["5000-digit-integer", "NaN", "Infinity"],
)
def test_numbers_json_cannot_hold_are_rejected_not_stuck(app: App, funded: str, raw: bytes) -> None:
    path = drop(app.inbox.root, "big.json", raw, "acme")
    outcome = app.inbox.process(path)
    assert outcome.status == "rejected" and not path.exists()
    assert read_json(path.parent / "rejected" / "big.json.error.json")["reason"] == "invalid_json"


@pytest.mark.parametrize("length", [229, 231, 250, 255])
def test_every_legal_file_name_gets_its_receipt_or_error_file(
    app: App, funded: str, length: int
) -> None:
    good = "g" * (length - len(".json")) + ".json"
    bad = "b" * (length - len(".json")) + ".json"
    accepted = app.inbox.process(
        drop(app.inbox.root, good, _batch(f"long{length}"), "acme", in_place=True)
    )
    rejected = app.inbox.process(drop(app.inbox.root, bad, b"{not json", "acme", in_place=True))
    assert accepted.status == "accepted" and rejected.status == "rejected"
    for outcome, suffix in ((accepted, ".receipt.json"), (rejected, ".error.json")):
        assert outcome.path is not None and outcome.path.exists()
        document = read_json(outcome.path.with_name(outcome.path.name + suffix))
        assert len((outcome.path.name + suffix).encode()) <= 255
        assert document["file"] in (good, bad)
        if length + len(suffix) + len("..tmp") > 255:  # shortened; the original is named
            assert document["filed_as"] == outcome.path.name != document["file"]
    assert not any(p.name.startswith(".") for p in (app.inbox.root / "acme").rglob("*"))


def test_long_names_that_clash_stay_apart(app: App, funded: str) -> None:
    names = ["a" * 245 + "1.json", "a" * 245 + "2.json"]
    dropped = [
        drop(app.inbox.root, n, _batch(f"r{i}"), "acme", in_place=True) for i, n in enumerate(names)
    ]
    paths = [app.inbox.process(path).path for path in dropped]
    assert paths[0] is not None and paths[1] is not None and paths[0] != paths[1]


def test_a_kill_between_receipt_and_move_files_the_drop_once_not_as_duplicate(
    app: App, settings: Settings, funded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _batch("nightly")
    path = drop(app.inbox.root, "n.json", raw, "acme")

    def killed(*_: Any) -> bool:
        raise SystemExit("killed")  # the process dies right after writing the receipt

    monkeypatch.setattr(fsops, "move_opened", killed)
    with pytest.raises(SystemExit):
        app.inbox.process(path)
    monkeypatch.undo()
    accepted = path.parent / "accepted"
    assert (accepted / "n.json.receipt.json").exists() and path.exists()
    restarted = build_app(settings)
    outcome = restarted.inbox.process(path)
    assert outcome.status == "accepted" and "duplicate" not in outcome.document
    assert sorted(p.name for p in accepted.iterdir()) == ["n.json", "n.json.receipt.json"]
    receipt = read_json(accepted / "n.json.receipt.json")
    assert receipt["status"] == "in_progress"
    (row,) = restarted.store.list_batches()
    assert all(t.issue_number for t in restarted.store.get_tasks(row.batch_id))
    again = restarted.inbox.process(
        drop(app.inbox.root, "n.json", raw, "acme")
    )  # dropped twice: duplicate
    assert again.document["duplicate"] is True


@pytest.mark.tinydb_files
def test_no_temp_file_or_lease_is_left_behind(
    app: App, settings: Settings, forge: SandboxForge, funded: str
) -> None:
    path = drop(app.inbox.root, "n.json", _batch("litter"), "acme")
    accepted = path.parent / "accepted"
    accepted.mkdir()
    stale = accepted / ".n.json.receipt.json.tmp"  # what a kill mid-write leaves
    stale.write_text("{")
    outcome = app.inbox.process(path)
    assert not stale.exists()
    assert sorted(p.name for p in accepted.iterdir()) == ["n.json", "n.json.receipt.json"]
    batch_id = outcome.document["batch_id"]
    leases = settings.state_path / "leases"
    assert list(leases.iterdir()) == [leases / f"{batch_id}.lock"]
    finish_issues(forge, f"{forge.user}/eval-acme-{batch_id}")
    app.poller.poll_completed(batch_id, full=True)
    app.delivery.emit(batch_id)
    assert list(leases.iterdir()) == []
    (leases / "20200101-000000-000abcdef.lock").write_text("")  # left by an older version
    build_app(settings)
    assert list(leases.iterdir()) == []
