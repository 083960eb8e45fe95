"""The `pulls` lane mode: behaves like the real lane controller (PR that closes the issue).

Per picked-up issue: a status comment carrying a fingerprint marker, a PR whose body says
`Closes #N`, then - `merge_delay` later - a merge (the merge closes the issue) or an
abandon (PR closed unmerged, then the issue closed). The verdict comment and label come
before the close, or `comment_lag` seconds after it with `close_first`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from .errors import SandboxApiError
from .lane_config import LaneConfig, LaneGate
from .models import Issue
from .state import ForgeState

TASK_LABEL = "eval-task"
FAIL_MARKER = "lane:fail"


def fingerprint(workflow: int, event: str, key: str) -> str:
    """16-hex fingerprint of one controller write (same inputs -> same value)."""
    return hashlib.sha256(f"{workflow}:{event}:{key}".encode()).hexdigest()[:16]


def marker(fp: str) -> str:
    """The invisible HTML comment the controller puts in its comments."""
    return f"<!-- controller:fingerprint:{fp} -->"


def verdict_comment(title: str, passed: bool) -> str:
    """The final comment the lane posts for an issue."""
    word, verdict = ("PASS", "pass") if passed else ("FAIL", "fail")
    return (
        f'Lane verdict: {word} for "{title}".\n\n'
        f'```json\n{{"checks": 3, "verdict": "{verdict}"}}\n```'
    )


@dataclass
class _Plan:
    issue: Issue
    pr: Issue
    merge: bool
    act_at: float
    comment_at: float | None = None


class PullsLane:
    """Per-issue plans of the `pulls` mode; `step` is called with the state lock held."""

    def __init__(self, state: ForgeState, gate: LaneGate) -> None:
        self.state = state
        self.gate = gate
        self._plans: dict[int, _Plan] = {}
        self._seen: set[int] = set()
        self._rng = random.Random(0)
        self._seed = 0

    def step(self, config: LaneConfig, now: float, pick_up: bool) -> int:
        """Advance every plan due at `now` (and pick up new issues); returns actions taken."""
        if config.seed != self._seed:  # a new seed restarts the merge/abandon draw
            self._rng, self._seed = random.Random(config.seed), config.seed
        actions = 0
        if pick_up:
            for issue in self._due(config, now):
                actions += self._pick_up(issue, config, now)
        for plan in list(self._plans.values()):
            if not self._held(plan.issue):
                actions += self._advance(plan, config, now)
        return actions

    def _held(self, issue: Issue) -> bool:
        return self.gate.is_held(issue.repo.owner.login, issue.repo.name, issue.number)

    def _due(self, config: LaneConfig, now: float) -> list[Issue]:
        return [
            issue
            for issue in list(self.state.open_issues.values())
            if issue.id not in self._seen
            and not issue.is_pull
            and now - issue.created >= config.delay
            and not self._held(issue)
            and any(label.name == TASK_LABEL for label in issue.labels.values())
        ]

    def _pick_up(self, issue: Issue, config: LaneConfig, now: float) -> int:
        self._seen.add(issue.id)
        state, number = self.state, issue.number
        status = fingerprint(issue.id, "picked-up", issue.title)
        state.comment_on(
            issue, f"Controller picked up #{number}; implementing.\n\n{marker(status)}"
        )
        try:
            pr = state.open_pull(
                issue.repo,
                state.lane_bot,
                f"lane/issue-{number}",
                "main",
                f"Resolve #{number}: {issue.title}",
                f"Closes #{number}\n\n{marker(fingerprint(issue.id, 'pr', ''))}",
            )
        except SandboxApiError:
            return 1  # a PR for this branch is already open: leave the issue to a human
        merge = FAIL_MARKER not in issue.body and self._rng.random() < config.merge_ratio
        self._plans[issue.id] = _Plan(issue, pr, merge, now + config.merge_delay)
        return 1

    def _advance(self, plan: _Plan, config: LaneConfig, now: float) -> int:
        if plan.comment_at is not None:
            if now < plan.comment_at:
                return 0
            self._verdict(plan)
            del self._plans[plan.issue.id]
            return 1
        if now < plan.act_at:
            return 0
        if not config.close_first:
            self._verdict(plan)
        self._resolve(plan)
        if config.close_first:
            plan.comment_at = now + config.comment_lag
            return 1 + self._advance(plan, config, now) if config.comment_lag == 0 else 1
        del self._plans[plan.issue.id]
        return 1

    def _resolve(self, plan: _Plan) -> None:
        state, pr = self.state, plan.pr
        assert pr.pull is not None
        if pr.pull.merged is None and pr.closed is None:
            if plan.merge:
                state.merge(pr, state.lane_bot)
            else:
                state.close(pr)
        state.close(plan.issue)  # no-op when the merge already closed it

    def _verdict(self, plan: _Plan) -> None:
        issue = plan.issue
        fp = fingerprint(issue.id, "verdict", issue.title)
        body = f"{verdict_comment(issue.title, plan.merge)}\n\n{marker(fp)}"
        self.state.comment_on(issue, body)
        self.state.label_named(issue, ["eval-pass" if plan.merge else "eval-fail"])
