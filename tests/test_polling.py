"""Poll by change: forge requests per cycle follow what changed, not how many tasks are open;
and a result the open-issue counts would hide (a reopened or human issue, a pasted marker,
a closure after the count) is still picked up."""

from __future__ import annotations

import time

from conftest import tasks

from dropbox_eval.app import App, build_app, build_service, service_for
from dropbox_eval.config import Settings
from dropbox_eval.errors import ForgePermanent
from dropbox_eval.forge.markers import issue_body
from dropbox_eval.lifecycle.attempts import is_permanent
from dropbox_eval.models import BatchStatus, TaskRecord, TaskSpec, TaskStatus
from dropbox_eval.results.poller import COUNT_SKEW
from dropbox_eval.sandbox import SandboxForge


def _shared_repo(settings: Settings, forge: SandboxForge, name: str) -> tuple[App, list[str]]:
    """Three batches of four tasks in one shared repo."""
    app = build_app(settings.model_copy(update={"repo": f"{forge.user}/{name}"}))
    app.billing.add_client("acme", 100)
    ids = [
        app.intake.submit_batch("acme", tasks(4), batch_ref=f"r{i}")["batch_id"] for i in range(3)
    ]
    return app, ids


def _two_batches(
    settings: Settings, forge: SandboxForge, repo: str, count: int = 1, **update: object
) -> tuple[App, str, str]:
    """Two batches (refs `a`, `b`) of `count` tasks each in the shared repo `repo`."""
    app = build_app(settings.model_copy(update={"repo": f"{forge.user}/{repo}", **update}))
    app.billing.add_client("acme", 100)
    first, second = (
        app.intake.submit_batch("acme", tasks(count), batch_ref=ref)["batch_id"] for ref in "ab"
    )
    return app, first, second


def test_shared_repo_costs_one_request_per_idle_cycle(
    settings: Settings, forge: SandboxForge
) -> None:
    app, ids = _shared_repo(settings, forge, "shared")
    service = service_for(app)
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
    service = service_for(app)
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
    app, first, second = _two_batches(settings, forge, "shared")
    service = service_for(app)
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
    app, service = build_service(app.settings)  # its parts: the service's own
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
    # the issue's marker names its batch; changed, it is read again at the visit's end
    assert reads == [ids[1], ids[1]]
    assert app.store.get_tasks(ids[1])[2].status == TaskStatus.PASSED
    edited = app.store.get_tasks(ids[2])[0]
    number = edited.issue_number or 0
    forge.state.edit_issue(forge.user, "lazy", number, body="the lane rewrote the body")
    forge.finish_issue(forge.user, "lazy", number, comment="no", labels=["eval-fail"])
    reads.clear()
    service.poll_cycle()
    # without its marker, every batch is read once, and the changed one again at the end
    assert sorted(reads) == sorted([*ids, ids[2]])
    assert app.store.get_tasks(ids[2])[0].status == TaskStatus.FAILED


def _cron_cycle(settings: Settings) -> App:
    """One `dropbox-eval run --once` from cron: a new process, whose only cycle is full."""
    app = build_app(settings)
    service_for(app).poll_cycle()
    return app


def test_a_shared_repo_closure_is_found_though_another_issue_keeps_the_count_up(
    settings: Settings, forge: SandboxForge
) -> None:
    shared = settings.model_copy(update={"repo": f"{forge.user}/shared"})
    app = build_app(shared)
    app.billing.add_client("acme", 100)
    old = app.intake.submit_batch("acme", tasks(1), batch_ref="old")["batch_id"]
    live = app.intake.submit_batch("acme", tasks(1), batch_ref="live")["batch_id"]
    _cron_cycle(shared)
    old_issue = app.store.get_tasks(old)[0].issue_number or 0
    forge.finish_issue(forge.user, "shared", old_issue, comment="ok", labels=["eval-pass"])
    _cron_cycle(shared)
    assert app.store.get_batch(old).status == BatchStatus.COMPLETED
    # someone reopens the finished batch's issue to look at it again
    forge.state.edit_issue(forge.user, "shared", old_issue, state="open")
    number = app.store.get_tasks(live)[0].issue_number or 0
    forge.finish_issue(forge.user, "shared", number, comment="ok", labels=["eval-pass"])
    for _ in range(3):
        _cron_cycle(shared)  # the label count (1) equals the live batch's open tasks (1)
    assert app.store.get_tasks(live)[0].status == TaskStatus.PASSED


def test_a_per_batch_repo_closure_is_found_though_a_human_issue_keeps_the_count_up(
    settings: Settings, forge: SandboxForge
) -> None:
    app = build_app(settings)
    app.billing.add_client("acme", 100)
    ids = [
        app.intake.submit_batch("acme", tasks(1), batch_ref=f"b{n}")["batch_id"] for n in range(2)
    ]
    _cron_cycle(settings)  # every repo listed once: each batch has been polled
    repo = app.store.get_batch(ids[0]).repo.split("/", 1)[1]
    forge.state.create_issue(forge.user, repo, forge.user, "a question about this eval")
    number = app.store.get_tasks(ids[0])[0].issue_number or 0
    forge.finish_issue(forge.user, repo, number, comment="ok", labels=["eval-pass"])
    for _ in range(3):
        _cron_cycle(settings)  # the repo counts 1 open issue (the human's), 1 expected
    assert app.store.get_tasks(ids[0])[0].status == TaskStatus.PASSED


def test_a_full_poll_every_cycle_still_finds_closures(
    settings: Settings, forge: SandboxForge
) -> None:
    """The same as a long-running service with `full_poll_every=1`."""
    app, left_open, live = _two_batches(settings, forge, "every", full_poll_every=1)
    service = service_for(app)
    service.poll_cycle()
    app.lifecycle.fail(left_open, "operator gave up")  # its issue closed ...
    forge.state.edit_issue(  # ... and reopened by a person: a labelled open issue of no live batch
        forge.user, "every", app.store.get_tasks(left_open)[0].issue_number or 0, state="open"
    )
    number = app.store.get_tasks(live)[0].issue_number or 0
    forge.finish_issue(forge.user, "every", number, comment="ok", labels=["eval-pass"])
    for _ in range(3):
        service.poll_cycle()
    assert app.store.get_tasks(live)[0].status == TaskStatus.PASSED


def test_an_issue_whose_marker_names_another_live_batch_is_still_found(
    settings: Settings, forge: SandboxForge
) -> None:
    app, first, second = _two_batches(settings, forge, "marks", 2)
    service = service_for(app)
    service.poll_cycle()  # full; both batches checked
    service.poll_cycle()
    task = app.store.get_tasks(first)[0]
    number = task.issue_number or 0
    spec = TaskSpec(task_id="t1", title="Task 1", body="Do thing 1.")
    # the lane pasted the other batch's task text (its marker last) over this body
    forge.state.edit_issue(forge.user, "marks", number, body=issue_body(second, spec))
    forge.finish_issue(forge.user, "marks", number, comment="ok", labels=["eval-pass"])
    for _ in range(3):
        service.poll_cycle()  # incremental cycles (full every 10th)
    assert app.store.get_tasks(first)[0].status == TaskStatus.PASSED


def test_a_closure_after_the_count_does_not_hide_a_deleted_issue(
    settings: Settings, forge: SandboxForge
) -> None:
    """The count predates the closure the listing shows: only closures before the count's
    forge time explain a lower count."""
    app = build_app(settings.model_copy(update={"repo": f"{forge.user}/race"}))
    app.billing.add_client("acme", 100)
    batch_id = app.intake.submit_batch("acme", tasks(3))["batch_id"]
    service_for(app).poll_cycle()
    first, second, _ = app.store.get_tasks(batch_id)
    forge.delete_issue(forge.user, "race", first.issue_number or 0)
    assert app.gitea is not None
    count = app.gitea.open_counts(forge.user)[f"{forge.user}/race"]  # the scout counts ...
    counted = (count, app.gitea.listed_at)
    # ... and the lane closes another issue before this repo's visit lists it (in a later
    # second: the forge's clock has whole seconds)
    time.sleep(COUNT_SKEW.total_seconds() + 1.1)
    number = second.issue_number or 0
    forge.finish_issue(forge.user, "race", number, comment="ok", labels=["eval-pass"])
    app.poller.poll_batches([batch_id], full=True, open_count=counted)
    statuses = [t.status for t in app.store.get_tasks(batch_id)]
    assert statuses[:2] == [TaskStatus.MISSING, TaskStatus.PASSED], statuses


def test_per_batch_repos_with_a_full_poll_every_cycle_still_search(
    settings: Settings, forge: SandboxForge
) -> None:
    app = build_app(settings.model_copy(update={"full_poll_every": 1}))
    app.billing.add_client("acme", 100)
    ids = [
        app.intake.submit_batch("acme", tasks(1), batch_ref=f"b{n}")["batch_id"] for n in range(2)
    ]
    service = service_for(app)
    service.poll_cycle()
    service.poll_cycle()  # a search: the counts alone would come next
    repo = app.store.get_batch(ids[1]).repo.split("/", 1)[1]
    forge.state.create_issue(forge.user, repo, forge.user, "a question about this eval")
    number = app.store.get_tasks(ids[1])[0].issue_number or 0
    forge.finish_issue(forge.user, repo, number, comment="ok", labels=["eval-pass"])
    for _ in range(3):
        service.poll_cycle()
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.PASSED


def test_a_4xx_to_a_read_is_a_failed_visit_not_a_failed_batch(
    app: App, forge: SandboxForge, funded: str
) -> None:
    assert is_permanent(ForgePermanent("POST /issues: 413", 413, "POST"))
    assert not is_permanent(ForgePermanent("GET /issues: 422", 422, "GET"))
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    forge.fail_next(3, 422, path_contains="/issues", method="GET")
    service_for(app).poll_cycle()
    batch = app.store.get_batch(batch_id)
    assert batch.status == BatchStatus.RUNNING and batch.attempts == 1
