"""Review of the count-reconciled polling (scout `_reconcile`, poller `_NOT_LISTED`, OpenTasks):
results that must still be picked up."""

from __future__ import annotations

import time

from conftest import tasks

from dropbox_eval.app import App, build_app
from dropbox_eval.config import Settings
from dropbox_eval.forge.markers import issue_body
from dropbox_eval.models import BatchStatus, TaskSpec, TaskStatus
from dropbox_eval.results.poller import COUNT_SKEW
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service


def _cron_cycle(settings: Settings) -> App:
    """One `dropbox-eval run --once` from cron: a new process, whose only cycle is full."""
    app = build_app(settings)
    Service(app).poll_cycle()
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
    update = {"repo": f"{forge.user}/every", "full_poll_every": 1}
    app = build_app(settings.model_copy(update=update))
    app.billing.add_client("acme", 100)
    left_open = app.intake.submit_batch("acme", tasks(1), batch_ref="a")["batch_id"]
    live = app.intake.submit_batch("acme", tasks(1), batch_ref="b")["batch_id"]
    service = Service(app)
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
    app = build_app(settings.model_copy(update={"repo": f"{forge.user}/marks"}))
    app.billing.add_client("acme", 100)
    first = app.intake.submit_batch("acme", tasks(2), batch_ref="a")["batch_id"]
    second = app.intake.submit_batch("acme", tasks(2), batch_ref="b")["batch_id"]
    service = Service(app)
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
    Service(app).poll_cycle()
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
    service = Service(app)
    service.poll_cycle()
    service.poll_cycle()  # a search: the counts alone would come next
    repo = app.store.get_batch(ids[1]).repo.split("/", 1)[1]
    forge.state.create_issue(forge.user, repo, forge.user, "a question about this eval")
    number = app.store.get_tasks(ids[1])[0].issue_number or 0
    forge.finish_issue(forge.user, repo, number, comment="ok", labels=["eval-pass"])
    for _ in range(3):
        service.poll_cycle()
    assert app.store.get_tasks(ids[1])[0].status == TaskStatus.PASSED
