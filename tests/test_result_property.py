"""One forge history, one result, whatever the poll timing: a Hypothesis
property.

Hypothesis generates a lane history for each of two tasks: closes and reopens by the lane
and by a human, pull requests (`Closes #N`, the keyword in a code block, a mention) merged
or abandoned, verdict labels put on and taken off, comments by the lane, by a human and by
a human carrying the lane's marker, comment edits and deletes, and the issue deleted, at
whole-second instants over 0..45 s, so that changes fall before and after the settle
moment (settle time 10 s). Each history is played on the sandbox forge on a manual clock
against two services at once:

- A only polls, at generated instants (one may be 30 s after a change), with its two
  batches in two repos, so each cycle goes through the cross-repo search; now and then its
  forge answers later than A waits (a timeout);
- B has a webhook: the forge's deliveries reach it after every change, and B visits the
  repo they name at once or at generated instants later; besides, it polls.

Forge errors (500, or a proxy's 504) hit chosen reads of an issue (its GET or timeline),
each made again at a later visit. Once all settled, each report must be the history as of
the issue's settle moment, by the model in tests/history_model.py.

CI runs the explicit examples (shrunk failures are kept as such) and 12 generated ones,
derandomized; `PROPERTY_EXAMPLES=200` runs more from a random seed, for a local hunt.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from conftest import settings_on, wait_for
from helpers import fixed_report
from history_model import (
    HUMAN,
    LANE,
    MARKER,
    SETTLE,
    VERDICTS,
    Outcome,
    Step,
    Story,
    effective,
    outcomes,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dropbox_eval.app import App, build_app, forge_worker
from dropbox_eval.sandbox import ManualClock, SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api
from dropbox_eval.workers import ForgeWorker

HUNT = "PROPERTY_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "12"))
HORIZON, POLLS_UNTIL = 45, 60  # the last instant of a change, of a poll
GAPS = (0, 0, 1, 3, 9, 10, 10, 11, 14, 20)  # seconds between steps: ties, and around SETTLE
ACTIONS = (  # weighted by repetition; the first ones are what shrinking aims at
    *("finish", "comment", "label", "close", "edit", "reopen", "unlabel", "pull", "merge"),
    *("human", "marked", "delete", "abandon", "finish", "label", "edit", "pull", "merge"),
    *("delete", "close", "unlabel"),
)
ENDINGS = ("finish", "close", "merge")
WHO = st.sampled_from([LANE, HUMAN])
ARGUMENTS = {
    "finish": st.sampled_from(sorted(VERDICTS)),
    "label": st.sampled_from(sorted(VERDICTS)),
    "unlabel": st.sampled_from(sorted(VERDICTS)),
    "close": WHO,
    "reopen": WHO,
    "pull": st.sampled_from(["closes", "fenced", "mention"]),
    **dict.fromkeys(("edit", "delete", "merge", "abandon"), st.integers(0, 3)),
}
SECRET = "property-hook"
TASKS = [{"task_id": "t1", "title": "First"}, {"task_id": "t2", "title": "Second"}]
CLIENT_WAITS, FORGE_TAKES = 0.3, 0.5  # A's timeout, and the slowed forge's answer

Fault = tuple[float, int, str, str, int, int]  # (at, task, service, read, status, count)


class Scenario(NamedTuple):
    """Two histories and when the services look. An instant `k` is before the changes of
    second k, `k.5` after them."""

    histories: tuple[list[Step], list[Step]]
    a_polls: list[float] = []
    b_polls: list[float] = []
    b_at_once: bool = True  # B visits the repo a webhook named right after each change
    b_nudged: list[float] = []  # else at these instants
    faults: list[Fault] = []  # forge errors on one issue's reads, armed at `at`
    timeouts: list[float] = []  # A polls with the forge slower than A waits


@st.composite
def histories(draw: st.DrawFn) -> list[Step]:
    """The lane's work, its end (a close, a merge, or verdict comment, label and close in
    one second), then what others do after, at non-decreasing whole seconds; now and then
    the issue is deleted."""
    instant, steps = 0, []
    for actions, least in ((ACTIONS, 0), (ENDINGS, 1), (ACTIONS, 1)):
        for _ in range(draw(st.integers(least, 1 if actions is ENDINGS else 4))):
            instant = min(HORIZON, instant + draw(st.sampled_from(GAPS)))
            action = draw(st.sampled_from(actions))
            arg = draw(ARGUMENTS.get(action, st.none()))
            if action == "finish":
                steps += [(instant, "comment", None), (instant, "label", arg)]
                action, arg = "close", LANE
            steps.append((instant, action, arg))
    if draw(st.integers(0, 7)) == 0:
        where = draw(st.integers(0, len(steps)))
        steps.insert(where, (steps[where - 1][0] if where else 0, "delete_issue", None))
    return steps


MOMENTS = st.integers(0, 2 * POLLS_UNTIL).map(lambda n: n / 2)
FAULTS = st.tuples(
    MOMENTS,
    st.integers(0, 1),
    st.sampled_from("AB"),
    st.sampled_from(["timeline", "issue"]),
    st.sampled_from([500, 504]),
    st.integers(1, 3),
)
SCENARIOS = st.builds(
    Scenario,
    histories=st.tuples(histories(), histories()),
    a_polls=st.lists(MOMENTS, max_size=5).map(sorted),
    b_polls=st.lists(MOMENTS, max_size=3).map(sorted),
    b_at_once=st.booleans(),
    b_nudged=st.lists(MOMENTS, max_size=4).map(sorted),
    faults=st.lists(FAULTS, max_size=3),
    timeouts=st.lists(MOMENTS, max_size=1),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not HUNT,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
@given(SCENARIOS)
# the settle rule's hard cases: closed with eval-pass and "PASS early" at 0, at 14 the label
# swapped and the comment edited; a reopen and a close with eval-fail; a merge after a
# close by hand. A reads at once and 30 s later, B with its webhook and a 500.
@example(
    Scenario(
        (
            [(0, "comment", None), (0, "label", "eval-pass"), (0, "close", LANE)]
            + [(14, "unlabel", "eval-pass"), (14, "label", "eval-fail"), (14, "edit", 0)],
            [(0, "comment", None), (0, "label", "eval-pass"), (0, "close", LANE)]
            + [(14, "reopen", HUMAN), (14, "label", "eval-fail"), (14, "close", LANE)],
        ),
        a_polls=[10.0, 44.0],
        faults=[(10.0, 0, "B", "timeline", 500, 3)],
    )
)
@example(
    Scenario(
        (
            [(0, "pull", "closes"), (0, "comment", None), (0, "close", HUMAN), (14, "merge", 0)],
            [(0, "label", "eval-fail"), (0, "label", "eval-pass"), (0, "close", LANE)]
            + [(14, "unlabel", "eval-fail")],  # found: as of 0 both labels, eval-fail first
        ),
        a_polls=[30.0],
        b_at_once=False,
        b_nudged=[31.0],
    )
)
# a summary deleted within the settle time; an issue deleted before it settled
@example(
    Scenario(
        (
            [(0, "marked", None), (3, "comment", None), (3, "close", LANE), (8, "delete", 1)],
            [(0, "close", LANE), (5, "delete_issue", None)],
        ),
        a_polls=[1.0, 4.5, 13.0],
        b_polls=[4.0],
    )
)
def test_the_report_is_the_history_as_of_its_settle_moment(scenario: Scenario) -> None:
    stories = [effective(list(steps)) for steps in scenario.histories]
    with _stage() as stage:
        stage.play(stories, scenario)
        for name, service, results in stage.results():
            for task, (result, copy) in enumerate(results):
                allowed = outcomes(stories[task])
                got = _outcome(result, copy, allowed[0].summary is not None)
                assert got in allowed, (
                    f"service {name}, task {task}: {got} is not one of {allowed}; "
                    f"played {stories[task].steps}; errors {service.errors}"
                )


@dataclass
class Copy:
    """One task's issue in one service's repo, and what was made on it."""

    repo: str
    number: int
    pulls: list[int] = field(default_factory=list)  # numbers, in the history's order
    comments: list[int] = field(default_factory=list)  # ids, in the history's order


@dataclass
class Service:
    """A service (its own state), how it visits the forge, and its batches."""

    app: App
    worker: ForgeWorker
    batches: list[str]
    errors: list[str] = field(default_factory=list)

    def cycle(self, only: set[str] | None = None) -> None:
        """One forge cycle (or the visit of the repos `only` names), run to its end."""
        wait(self.worker.cycle(only))

    def visit_nudged(self) -> None:
        """The visit of the repos the webhook's deliveries named since the last one."""
        self.cycle(self.app.nudges.take())

    def completed(self) -> bool:
        return all(self.app.store.get_batch(b).status == "completed" for b in self.batches)

    def copy(self, batch: int, index: int) -> Copy:
        task = self.app.store.get_tasks(self.batches[batch])[index]
        return Copy(self.app.store.get_batch(self.batches[batch]).repo, task.issue_number or 0)


class Stage:
    """The forge on a manual clock and services A and B; plays a scenario on both."""

    def __init__(self, forge: SandboxForge, polled: Service, pushed: Service) -> None:
        self.forge, self.a, self.b = forge, polled, pushed
        self.state = forge.state
        clock = forge.state.clock
        assert isinstance(clock, ManualClock)
        self.clock = clock
        self.copies = [(polled.copy(i, 0), pushed.copy(0, i)) for i in range(2)]
        self.stories: list[Story] = []
        self.scenario = Scenario(([], []))

    def play(self, stories: list[Story], scenario: Scenario) -> None:
        """The scenario, then cycles until every batch ended."""
        self.stories, self.scenario = stories, scenario
        for repo in {copy.repo for pair in self.copies for copy in pair}:
            owner, name = repo.split("/")
            for label in VERDICTS:
                self.state.create_label(owner, name, label, "00aa00")
        start = self.clock.advance(2)
        items: list[tuple[float, str, Any]] = [(f[0], "fault", f) for f in scenario.faults]
        for task, story in enumerate(stories):
            items += [(step[0] + 0.25, "step", (task, step)) for step in story.steps]
        for kind in ("a_polls", "b_polls", "b_nudged", "timeouts"):
            items += [(at, kind, None) for at in getattr(scenario, kind)]
        polls = {"a_polls": self.a.cycle, "b_polls": self.b.cycle, "b_nudged": self.b.visit_nudged}
        for at, kind, what in sorted(items, key=lambda item: item[0]):
            self.clock.set(start + int(at))
            polls[kind]() if kind in polls else getattr(self, f"_{kind}")(what)

        def ended() -> bool:  # each remaining fault spends one read a cycle
            self.clock.advance(SETTLE + 1)
            self.a.cycle()
            self.b.cycle()
            return self.a.completed() and self.b.completed()

        assert wait_for(ended), self.a.errors + self.b.errors

    def results(self) -> Iterator[tuple[str, Service, list[tuple[dict[str, Any], Copy]]]]:
        """Each service's result of each task, with the task's issue."""
        for name, service in (("A", self.a), ("B", self.b)):
            reports = [fixed_report(service.app.store, b) for b in service.batches]
            found = [r["results"] for r in reports if r is not None]
            flat = found[0] + found[1] if name == "A" else found[0]
            yield name, service, [(flat[i], self.copies[i][name == "B"]) for i in range(2)]

    def _fault(self, fault: Fault) -> None:
        _at, task, service, read, status, count = fault
        copy = self.copies[task][service == "B"]
        suffix = "/timeline" if read == "timeline" else ""
        path = f"/repos/{copy.repo}/issues/{copy.number}{suffix}"
        self.forge.fail_next(count, status, path_contains=path, method="GET")

    def _step(self, what: tuple[int, Step]) -> None:
        task, (_at, action, arg) = what
        for copy in self.copies[task]:
            getattr(self, f"_{action}")(copy, arg, self.stories[task])
        assert self.state.hooks.drain(10), "the forge's webhook deliveries did not land"
        if self.scenario.b_at_once:
            self.b.visit_nudged()

    def _timeouts(self, _: None) -> None:
        assert self.a.app.gitea is not None
        self.a.app.gitea.timeout = CLIENT_WAITS
        self.forge.set_delay(FORGE_TAKES)
        try:
            self.a.cycle()
        finally:
            self.forge.set_delay(0)
            self.a.app.gitea.timeout = self.a.app.settings.forge_timeout

    # -- the steps, on one copy of the issue ------------------------------------------------

    def _comment(self, copy: Copy, _: None, story: Story) -> None:
        comment = story.comments[len(copy.comments)]
        body = comment.body + (f"\n\n{MARKER}" if comment.kind == "marked" else "")
        made = self.state.create_comment(*_split(copy), copy.number, comment.author, body)
        copy.comments.append(int(made["id"]))

    _human = _marked = _comment

    def _edit(self, copy: Copy, index: int, story: Story) -> None:
        comment = story.comments[index]
        assert comment.edit is not None
        body = comment.edit[1] + (f"\n\n{MARKER}" if comment.kind == "marked" else "")
        self.state.edit_comment(*_split(copy), copy.comments[index], comment.author, body)

    def _delete(self, copy: Copy, index: int, story: Story) -> None:
        author = story.comments[index].author
        self.state.delete_comment(*_split(copy), copy.comments[index], author)

    def _delete_issue(self, copy: Copy, _: None, _story: Story) -> None:
        self.state.delete_issue(*_split(copy), copy.number)

    def _close(self, copy: Copy, who: str, _story: Story) -> None:
        self.state.edit_issue(*_split(copy), copy.number, state="closed", doer=who)

    def _reopen(self, copy: Copy, who: str, _story: Story) -> None:
        self.state.edit_issue(*_split(copy), copy.number, state="open", doer=who)

    def _label(self, copy: Copy, label: str, _story: Story) -> None:
        self.state.add_issue_labels(*_split(copy), copy.number, names=[label], doer=LANE)

    def _unlabel(self, copy: Copy, label: str, _story: Story) -> None:
        ids = {lb["name"]: lb["id"] for lb in self.state.list_labels(*_split(copy))[0]}
        self.state.remove_issue_label(*_split(copy), copy.number, int(ids[label]), doer=LANE)

    def _pull(self, copy: Copy, kind: str, _story: Story) -> None:
        text = {"closes": "Closes #{}", "fenced": "```\nCloses #{}\n```", "mention": "see #{}"}
        branch = f"lane/{copy.number}-{len(copy.pulls)}"
        made = self.state.create_pull(
            *_split(copy), LANE, head=branch, base="main", title="Change",
            body=text[kind].format(copy.number),
        )  # fmt: skip
        copy.pulls.append(int(made["number"]))

    def _merge(self, copy: Copy, index: int, _story: Story) -> None:
        self.state.merge_pull(*_split(copy), copy.pulls[index], LANE)

    def _abandon(self, copy: Copy, index: int, _story: Story) -> None:
        self.state.edit_pull(*_split(copy), copy.pulls[index], LANE, state="closed")


def _split(copy: Copy) -> tuple[str, str]:
    owner, name = copy.repo.split("/")
    return owner, name


def _outcome(result: dict[str, Any], copy: Copy, with_summary: bool) -> Outcome:
    """What the test compares of a result; its pull request named by its place among the
    history's (its number differs from one copy of the issue to the other)."""
    pull = result["pull_request"]
    if pull is not None:
        pull = (copy.pulls.index(pull["number"]), pull["merged"], pull["closed_issue"])
    summary = result["summary"] if with_summary else None
    return Outcome(result["status"], summary, bool(result.get("summary_edited_after_settle")), pull)


def _service(
    forge: SandboxForge, home: Path, batches: list[list[dict[str, Any]]], **extra: Any
) -> Service:
    app = build_app(settings_on(forge, home, settle_seconds=SETTLE, retry_base=0.05, **extra))
    assert app.gitea is not None
    app.gitea.sleep = lambda _seconds: None
    app.billing.add_client("acme", 10_000)
    errors: list[str] = []
    worker = forge_worker(app, threading.Event(), lambda what, exc: errors.append(f"{what}: {exc}"))
    ids = [str(app.intake.submit_batch("acme", tasks)["batch_id"]) for tasks in batches]
    return Service(app, worker, ids, errors)


@contextmanager
def _stage() -> Iterator[Stage]:
    """A new forge (its clock near the wall clock's) and services A and B, each example."""
    with tempfile.TemporaryDirectory() as home, SandboxForge(port=0, clock=ManualClock()) as forge:
        forge.state.add_user(HUMAN)
        polled = _service(forge, Path(home, "a"), [[TASKS[0]], [TASKS[1]]])  # two repos
        pushed = _service(forge, Path(home, "b"), [TASKS], forge_webhook_secret=SECRET)
        server = BackgroundServer(create_api(pushed.app.web), name="property-api")
        url = server.start()
        events = ["issues", "issue_comment", "pull_request"]
        repo = pushed.app.store.get_batch(pushed.batches[0]).repo
        forge.state.hooks.add(f"repo:{repo}", f"{url}/hooks/forge", SECRET, events)
        try:
            yield Stage(forge, polled, pushed)
        finally:
            server.stop()
            for service in (polled, pushed):
                service.worker.close()
