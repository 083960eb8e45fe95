"""Poll by change: forge requests per cycle follow what changed, not how many tasks are open."""

from __future__ import annotations

from conftest import tasks

from dropbox_eval.app import App, build_app
from dropbox_eval.config import Settings
from dropbox_eval.models import TaskRecord, TaskStatus
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service


def _shared_repo(settings: Settings, forge: SandboxForge, name: str) -> tuple[App, list[str]]:
    """Three batches of four tasks in one shared repo."""
    app = build_app(settings.model_copy(update={"repo": f"{forge.user}/{name}"}))
    app.billing.add_client("acme", 100)
    ids = [
        app.intake.submit_batch("acme", tasks(4), batch_ref=f"r{i}")["batch_id"] for i in range(3)
    ]
    return app, ids


def test_shared_repo_costs_one_request_per_idle_cycle(
    settings: Settings, forge: SandboxForge
) -> None:
    app, ids = _shared_repo(settings, forge, "shared")
    service = Service(app)
    service.poll_cycle()  # the first cycle is a full one
    forge.clear_requests()
    service.poll_cycle()
    idle = forge.requests
    assert [(r.method, r.path) for r in idle] == [
        ("GET", f"/api/v1/repos/{forge.user}/shared/issues")
    ]
    assert "since=" in idle[0].query and "state=closed" in idle[0].query
    finished = [app.store.get_tasks(ids[0])[0], app.store.get_tasks(ids[2])[3]]
    for task in finished:
        forge.finish_issue(
            forge.user, "shared", task.issue_number or 0, comment="ok", labels=["eval-pass"]
        )
    forge.clear_requests()
    service.poll_cycle()
    assert len(forge.requests) == 1 + len(finished)  # one listing + each closed timeline
    assert [t.status for t in app.store.get_tasks(ids[0])].count("passed") == 1
    assert [t.status for t in app.store.get_tasks(ids[1])].count("passed") == 0
    assert app.store.get_tasks(ids[2])[3].status == "passed"


def test_full_cycle_probes_first_and_lists_only_when_issues_vanished(
    settings: Settings, forge: SandboxForge
) -> None:
    # a shared repo: one listing per cycle, probed by count (per-batch repos: the search)
    shared = {"full_poll_every": 2, "repo": f"{forge.user}/probed"}
    app = build_app(settings.model_copy(update=shared))
    app.billing.add_client("acme", 200)
    batch_id = app.intake.submit_batch("acme", tasks(60))["batch_id"]
    repo = app.store.get_batch(batch_id).repo
    service = Service(app)
    service.poll_cycle()  # cycle 1: full
    service.poll_cycle()  # cycle 2: incremental
    forge.clear_requests()
    service.poll_cycle()  # cycle 3: full, nothing vanished: the count alone
    idle_full = [r.query for r in forge.requests]
    assert len(idle_full) == 1 and "limit=1" in idle_full[0]
    gone = app.store.get_tasks(batch_id)[5]
    forge.delete_issue(*repo.split("/"), gone.issue_number or 0)
    service.poll_cycle()  # cycle 4: incremental, cannot see a deletion
    assert app.store.get_tasks(batch_id)[5].status == "open"
    forge.clear_requests()
    service.poll_cycle()  # cycle 5: full, the probe sees one issue fewer
    assert app.store.get_tasks(batch_id)[5].status == "missing"
    listing = [r for r in forge.requests if "state=all" in r.query]
    assert len(listing) == 2  # 59 issues: two pages of 50, no empty third page


def test_an_unreadable_result_does_not_block_the_others(
    settings: Settings, forge: SandboxForge
) -> None:
    app = build_app(settings.model_copy(update={"repo": f"{forge.user}/shared"}))
    app.billing.add_client("acme", 100)
    first = app.intake.submit_batch("acme", tasks(1), batch_ref="a")["batch_id"]
    second = app.intake.submit_batch("acme", tasks(1), batch_ref="b")["batch_id"]
    service = Service(app)
    service.poll_cycle()
    broken = app.store.get_tasks(first)[0].issue_number
    for batch_id in (first, second):
        number = app.store.get_tasks(batch_id)[0].issue_number or 0
        forge.finish_issue(forge.user, "shared", number, comment="ok", labels=["eval-pass"])
    forge.fail_next(20, 502, path_contains=f"/issues/{broken}/timeline")
    service.poll_cycle()
    assert app.store.get_tasks(first)[0].status == "open"
    assert app.store.get_tasks(second)[0].status == "passed"
    forge.state.faults.clear()
    service.poll_cycle()  # the first batch kept its old `since`: the closure is listed again
    assert app.store.get_tasks(first)[0].status == "passed"


def _task_reads(app: App) -> list[str]:
    """Records which batches' tasks the store is asked for (the real store still answers)."""
    reads: list[str] = []
    real = app.store.get_tasks

    def recording(batch_id: str) -> list[TaskRecord]:
        reads.append(batch_id)
        return real(batch_id)

    app.store.get_tasks = recording  # type: ignore[method-assign]
    return reads


def test_a_shared_repo_poll_reads_only_the_batches_its_listing_names(
    settings: Settings, forge: SandboxForge
) -> None:
    app, ids = _shared_repo(settings, forge, "lazy")
    service = Service(app)
    service.poll_cycle()  # the first visit of each batch in a process reads its tasks
    reads = _task_reads(app)
    service.poll_cycle()
    assert reads == []  # nothing listed: no batch's tasks are read
    closed = app.store.get_tasks(ids[1])[2]
    forge.finish_issue(
        forge.user, "lazy", closed.issue_number or 0, comment="ok", labels=["eval-pass"]
    )
    reads.clear()
    service.poll_cycle()
    assert reads == [ids[1]]  # the issue's marker names its batch
    assert app.store.get_tasks(ids[1])[2].status == TaskStatus.PASSED
    edited = app.store.get_tasks(ids[2])[0]
    number = edited.issue_number or 0
    forge.state.edit_issue(forge.user, "lazy", number, body="the lane rewrote the body")
    forge.finish_issue(forge.user, "lazy", number, comment="no", labels=["eval-fail"])
    reads.clear()
    service.poll_cycle()
    assert sorted(reads) == sorted(ids)  # without its marker, every batch is read once
    assert app.store.get_tasks(ids[2])[0].status == TaskStatus.FAILED
