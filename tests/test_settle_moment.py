"""A result is the forge's history as of its settle moment, whatever the poll timing (issue
29): the seventeen histories of `histories.py`, one batch of seventeen tasks a service,
played at once on the sandbox forge (on a manual clock: exact instants, no sleeping)
under three services:

- `1 s`: polls every second of forge time, so it reads each result at its settle moment;
- `30 s`: polls every 30 s, so its first poll after the batch's start lands after every
  change;
- `30 s + webhooks`: the same polls, and the forge's webhooks delivering each change to the
  service's HTTP endpoint at once (each delivery visits the repo it names).

Each service also has its settle alarm (a visit of the repo when its first settling result
is due, as `Service` wires it), on the forge's clock here. All three reports must be the
table's rows; the one difference allowed is a summary edited after the settle moment,
read as it was by a service that read before the edit (`1 s`, and the alarm of
`30 s + webhooks`, which saw the close), and as edited, flagged, by one that read after.
Then, against the service: a summary deleted after the settle moment, a repo transferred
while its results settle, and the cross-repo search behind a lagging index.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import settings_on, tasks
from helpers import fixed_report
from histories import (
    FAIL,
    HISTORIES,
    PASS,
    SETTLE,
    Copy,
    History,
    Player,
    Row,
    early,
    late,
    reported,
    verdict,
)

from dropbox_eval.app import App, build_app, forge_worker
from dropbox_eval.models import BatchStatus
from dropbox_eval.sandbox import LANE_BOT, ManualClock, SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api
from dropbox_eval.workers import ForgeWorker

SECRET = "settle-moment-hook"
HORIZON = 120  # forge seconds: every history has settled and been read long before
HOOK_EVENTS = ["issues", "issue_comment", "pull_request"]


@dataclass(frozen=True)
class Mode:
    """How a service hears of changes: its poll interval (forge seconds), webhooks or not,
    and whether it reads a late-edited summary after the edit."""

    every: int
    hooked: bool
    reads_late: bool


MODES = {
    "1 s": Mode(1, hooked=False, reads_late=False),
    "30 s": Mode(30, hooked=False, reads_late=True),
    "30 s + webhooks": Mode(30, hooked=True, reads_late=False),
}


@dataclass
class Run:
    """A service with one batch, and its settle alarms on the forge's clock."""

    app: App
    worker: ForgeWorker
    batch_id: str
    mode: Mode
    errors: list[str] = field(default_factory=list)
    alarms: list[tuple[float, str]] = field(default_factory=list)  # (forge instant, repo)

    @property
    def repo(self) -> str:
        return str(self.app.store.get_batch(self.batch_id).repo)

    def cycle(self, only: set[str] | None = None) -> None:
        """A poll cycle (or a visit of the repos `only` names), run to its end."""
        wait(self.worker.cycle(only))

    def ring(self, now: float) -> None:
        """Visit the repos whose settle alarm is due by `now`."""
        due = {repo.casefold() for at, repo in self.alarms if at <= now}
        self.alarms = [(at, repo) for at, repo in self.alarms if at > now]
        self.cycle(due)

    def delivered(self, forge: SandboxForge) -> None:
        """The forge's webhook deliveries landed: visit what they named."""
        assert forge.state.hooks.drain(10), "the forge's webhook deliveries did not land"
        self.cycle(self.app.nudges.take() & {self.repo.casefold()})

    def results(self) -> list[dict[str, Any]]:
        batch = self.app.store.get_batch(self.batch_id)
        report = fixed_report(self.app.store, self.batch_id)
        assert batch.status == BatchStatus.COMPLETED and report is not None, batch.status
        found: list[dict[str, Any]] = report["results"]
        return found


def _clock(forge: SandboxForge) -> ManualClock:
    clock = forge.state.clock
    assert isinstance(clock, ManualClock)
    return clock


@pytest.fixture
def forge() -> Iterator[SandboxForge]:
    """A sandbox forge on a manual clock."""
    with SandboxForge(port=0, clock=ManualClock()) as running:
        yield running


def _app(forge: SandboxForge, home: Path, **extra: Any) -> App:
    app = build_app(settings_on(forge, home, settle_seconds=SETTLE, **extra))
    assert app.gitea is not None
    app.gitea.sleep = lambda _seconds: None
    app.billing.add_client("acme", 10_000)
    return app


def _run(forge: SandboxForge, home: Path, mode: Mode, count: int, stack: ExitStack) -> Run:
    """A service in `mode` with a batch of `count` tasks, its labels made."""
    app = _app(forge, home, **({"forge_webhook_secret": SECRET} if mode.hooked else {}))
    errors: list[str] = []
    worker = forge_worker(app, threading.Event(), lambda what, exc: errors.append(f"{what}: {exc}"))
    batch_id = str(app.intake.submit_batch("acme", tasks(count))["batch_id"])
    run = Run(app, worker, batch_id, mode, errors)
    clock = _clock(forge)
    app.poller.on_settling = lambda repo, seconds: run.alarms.append((clock() + seconds, repo))
    owner, name = run.repo.split("/")
    for label in (PASS, FAIL):
        forge.state.create_label(owner, name, label, "00aa00")
    if mode.hooked:
        server = BackgroundServer(create_api(app.web), name="settle-moment-api")
        url = server.start()
        stack.callback(server.stop)
        forge.state.hooks.add(f"repo:{run.repo}", f"{url}/hooks/forge", SECRET, HOOK_EVENTS)
    return run


@contextmanager
def _runs(
    forge: SandboxForge, home: Path, modes: dict[str, Mode], count: int
) -> Iterator[dict[str, Run]]:
    with ExitStack() as stack:
        homes = (home / f"service-{index}" for index in range(len(modes)))
        yield {name: _run(forge, next(homes), mode, count, stack) for name, mode in modes.items()}


def _players(forge: SandboxForge, runs: list[Run], count: int) -> list[Player]:
    """A player for each task: its issue in every run."""
    issues = [
        (r.repo, [t.issue_number or 0 for t in r.app.store.get_tasks(r.batch_id)]) for r in runs
    ]
    return [
        Player(forge.state, [Copy(repo, numbers[index]) for repo, numbers in issues])
        for index in range(count)
    ]


def _play(forge: SandboxForge, runs: list[Run], histories: list[History]) -> None:
    """Each history on its task's issue in every run; polls, alarms and deliveries."""
    clock = _clock(forge)
    players = _players(forge, runs, len(histories))
    for run in runs:  # the cycle right after the intake, as a service runs one
        run.cycle()
    start = clock.advance(2)
    for second in range(HORIZON):
        now = clock.set(start + second)
        for run in runs:  # an alarm fires 0.3 s after a window's end: before what comes next
            run.ring(now)
        for index, history in enumerate(histories):
            for _, action, arg in (e for e in history.events if e[0] == second):
                players[index].play(action, arg)
                for run in runs:
                    if run.mode.hooked:
                        run.delivered(forge)
        for run in runs:
            if second and second % run.mode.every == 0:
                run.cycle()
        if all(r.app.store.get_batch(r.batch_id).status != BatchStatus.RUNNING for r in runs):
            break
    for run in runs:
        assert not run.errors, run.errors
        counts = run.app.webhooks.counts
        assert bool(counts["accepted"]) == run.mode.hooked
        assert sum(counts.values()) == counts["accepted"], counts  # none refused


def _rows(run: Run) -> list[Row]:
    return [reported(result) for result in run.results()]


def _expected(mode: Mode, histories: list[History]) -> list[Row]:
    return [late(h.row) if mode.reads_late else early(h.row) for h in histories]


def test_seventeen_histories_give_one_report_whatever_the_timing(
    forge: SandboxForge, tmp_path: Path
) -> None:
    assert len(HISTORIES) == 17
    with _runs(forge, tmp_path, MODES, len(HISTORIES)) as runs:
        _play(forge, list(runs.values()), HISTORIES)
    rows = {name: _rows(run) for name, run in runs.items()}
    wrong = [
        f"{name}, {history.name}: reported {got}, the history means {want}"
        for name, run in runs.items()
        for history, got, want in zip(
            HISTORIES, rows[name], _expected(run.mode, HISTORIES), strict=True
        )
        if got != want
    ]
    assert not wrong, "\n".join(wrong)
    for index, history in enumerate(HISTORIES):  # the three reports, row by row
        same = [row[index] for row in rows.values()]
        assert len({(r.status, r.pull) for r in same}) == 1, history.name
        unflagged = [r for r in same if r.late is None]  # only a late edit is read as it is
        assert all(r == unflagged[0] for r in unflagged), history.name
        assert len(same) - len(unflagged) == (1 if history.row.late else 0), history.name


def test_a_summary_deleted_after_the_settle_moment_stays_for_a_reading_before_it(
    forge: SandboxForge, tmp_path: Path
) -> None:
    """A delete leaves no trace on Gitea (no entry, no `updated_at`): a reading before it
    has the comment, one after it has the lane's comment before that."""
    events = [(0, "comment", "first words"), *verdict(1, "PASS final", PASS), (14, "delete", 1)]
    deleted = History("summary_deleted_after_the_settle_moment", events, Row("passed", ""))
    modes = {name: MODES[name] for name in ("1 s", "30 s")}
    with _runs(forge, tmp_path, modes, 1) as runs:
        _play(forge, list(runs.values()), [deleted])
    assert _rows(runs["1 s"]) == [Row("passed", "PASS final")]
    assert _rows(runs["30 s"]) == [Row("passed", "first words")]


def test_a_batch_follows_its_repo_transferred_while_its_results_settle(
    forge: SandboxForge, tmp_path: Path
) -> None:
    clock = _clock(forge)
    app = _app(forge, tmp_path)
    worker = forge_worker(app, threading.Event(), lambda what, exc: pytest.fail(f"{what}: {exc}"))
    batch_id = str(app.intake.submit_batch("acme", tasks(3))["batch_id"])
    repo = app.store.get_batch(batch_id).repo
    owner, name = repo.split("/")
    first, second, third = (t.issue_number or 0 for t in app.store.get_tasks(batch_id))
    state = forge.state
    wait(worker.cycle())
    clock.advance(2)
    state.finish_issue(owner, name, first, comment="PASS before the move", labels=[PASS])
    clock.advance(1)
    wait(worker.cycle())  # settling, at the old path
    assert app.store.get_tasks(batch_id)[0].settling is not None
    moved = requests.post(
        f"{forge.url}/api/v1/repos/{repo}/transfer",
        json={"new_owner": state.org.login},
        headers={"Authorization": f"token {forge.token}"},
        timeout=30,
    )
    assert moved.status_code == 202, moved.text
    new_owner = state.org.login
    clock.advance(1)  # the lane works at the new path
    state.finish_issue(new_owner, name, second, comment="FAIL after the move", labels=[FAIL])
    pull = state.create_pull(
        new_owner, name, LANE_BOT, head="lane/3", base="main", title="Fix", body=f"Closes #{third}"
    )
    clock.advance(1)
    state.merge_pull(new_owner, name, pull["number"], LANE_BOT)
    forge.clear_requests()
    for _ in range(SETTLE + 3):
        clock.advance(1)
        wait(worker.cycle())
    batch = app.store.get_batch(batch_id)
    report = fixed_report(app.store, batch_id)
    assert batch.status == BatchStatus.COMPLETED and report is not None
    assert batch.repo == f"{new_owner}/{name}"
    assert any(r.status == 307 and f"/repos/{repo}/" in r.path for r in forge.requests)
    got = [(r["status"], r["summary"], r["pull_request"]) for r in report["results"]]
    assert got[:2] == [
        ("passed", "PASS before the move", None),
        ("failed", "FAIL after the move", None),
    ]
    assert got[2][0] == "passed" and got[2][2]["merged"] and got[2][2]["closed_issue"]
    assert got[2][2]["number"] == pull["number"]


def test_the_search_finds_a_close_behind_a_lagging_index_within_its_overlap(
    forge: SandboxForge, tmp_path: Path
) -> None:
    """The search's window overlaps the previous one by 10 s: an index 5 s behind misses a
    close at first, and the next search finds it (the repo is never listed meanwhile)."""
    clock = _clock(forge)
    app = _app(forge, tmp_path, full_poll_every=1000)
    worker = forge_worker(app, threading.Event(), lambda what, exc: pytest.fail(f"{what}: {exc}"))
    batches = [str(app.intake.submit_batch("acme", tasks(1))["batch_id"]) for _ in range(2)]
    repo = app.store.get_batch(batches[0]).repo
    owner, name = repo.split("/")
    number = app.store.get_tasks(batches[0])[0].issue_number or 0
    lag = requests.post(f"{forge.url}/_sandbox/index_lag", json={"seconds": 5}, timeout=30)
    assert lag.status_code == 200 and lag.json()["seconds"] == 5
    wait(worker.cycle())  # lists both repos once
    clock.advance(19)
    wait(worker.cycle())  # searched clean
    clock.advance(1)
    forge.finish_issue(owner, name, number, comment="PASS behind the index", labels=[PASS])
    forge.clear_requests()
    clock.advance(1)
    wait(worker.cycle())  # the index still holds the issue as it stood before the close
    assert app.store.get_tasks(batches[0])[0].settling is None
    clock.advance(5)
    wait(worker.cycle())  # the index caught up; the window's overlap covers the close
    assert app.store.get_tasks(batches[0])[0].settling is not None
    listings = [r for r in forge.requests if r.path == f"/api/v1/repos/{repo}/issues"]
    assert not listings  # found by the search alone
    clock.advance(SETTLE)
    wait(worker.cycle())
    batch = app.store.get_batch(batches[0])
    report = fixed_report(app.store, batches[0])
    assert batch.status == BatchStatus.COMPLETED and report is not None
    result = report["results"][0]
    assert (result["status"], result["summary"]) == ("passed", "PASS behind the index")
    assert app.store.get_batch(batches[1]).status == BatchStatus.RUNNING
