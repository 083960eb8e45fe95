"""An issue's history built entry by entry as Gitea's timeline shows it, and the issue as it
stands after it: `ForgeIssue` and `ForgeTimelineEntry` objects, no forge and no HTTP, for
the pure readers (`results.asof`, `results.lane`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dropbox_eval.forge.wire import ForgeIssue, ForgeTimelineEntry
from dropbox_eval.models import TaskStatus
from dropbox_eval.results.asof import as_of, settled_change
from dropbox_eval.results.lane import VerdictRules, read_result
from dropbox_eval.sandbox.mdstrip import strip_markdown
from dropbox_eval.sandbox.timeline import find_references

T0 = datetime(2026, 12, 2, 8, 0, 0, tzinfo=UTC)
SETTLE = timedelta(seconds=10)
LANE, MARKER = "lane-bot", "<!-- controller:"
RULES = VerdictRules(
    labels={"eval-pass": TaskStatus.PASSED, "eval-fail": TaskStatus.FAILED},
    merged=TaskStatus.PASSED,
    unmerged=TaskStatus.NO_VERDICT,
    lane_login=LANE,
    lane_marker=MARKER,
)


def at(seconds: int) -> datetime:
    """The instant `seconds` after the history's start."""
    return T0 + timedelta(seconds=seconds)


class History:
    """A timeline built entry by entry (instants in seconds from T0), and the issue (#1) as
    it stands after it."""

    def __init__(self) -> None:
        self.entries: list[ForgeTimelineEntry] = []
        self.labels: list[str] = []
        self.state = "open"

    def add(self, second: int, kind: str, **fields: Any) -> ForgeTimelineEntry:
        """An entry of type `kind` with Gitea's fields `fields`."""
        data = {"id": len(self.entries) + 1, "type": kind, "created_at": at(second), **fields}
        entry = ForgeTimelineEntry.model_validate(data)
        self.entries.append(entry)
        if kind in ("close", "reopen"):
            self.state = "closed" if kind == "close" else "open"
        return entry

    def label(self, second: int, name: str, *, on: bool = True) -> None:
        """A label added (or, `on=False`, removed)."""
        self.add(second, "label", body="1" if on else "", label={"name": name})
        if on:
            self.labels.append(name)
        else:
            self.labels.remove(name)

    def comment(
        self, second: int, body: str, who: str = LANE, edited: int | None = None
    ) -> ForgeTimelineEntry:
        """A comment by `who`, last edited at `edited` (never without one)."""
        return self.add(
            second,
            "comment",
            body=body,
            user={"login": who},
            updated_at=at(edited if edited is not None else second),
        )

    def pull(
        self, second: int, number: int, body: str, merged: int | None = None, repo: str = ""
    ) -> None:
        """A pull request #`number` whose body is `body`, merged at `merged` (open or
        abandoned without): the `pull_ref` entry Gitea records on this issue for what the
        body's text says of `#1` (none at all when the text does not name it)."""
        refs = find_references(strip_markdown(body))
        action = next((action for (_repo, n), action in refs if n == 1), None)
        if action is None:
            return
        pull = {"merged": merged is not None, "html_url": f"pulls/{number}"}
        if merged is not None:
            pull["merged_at"] = at(merged)
        ref = {"number": number, "pull_request": pull, "repository": {"full_name": repo}}
        self.add(second, "pull_ref", ref_action=action, ref_issue=ref)

    def close(self, second: int, commit: str = "") -> None:
        """A close: by a merge naming its `commit`, or by hand (no commit)."""
        self.add(second, "close", ref_commit_sha=commit)

    def issue(self) -> ForgeIssue:
        """The issue as it stands after the history: labels listed by name, as Gitea does."""
        last = max(e.changed_at for e in self.entries)
        closes = [e.created_at for e in self.entries if e.type == "close"]
        return ForgeIssue(
            number=1,
            title="t",
            state=self.state,
            labels=sorted(self.labels),
            html_url="",
            updated_at=last,
            closed_at=closes[-1] if self.state == "closed" and closes else None,
        )

    def settled(self, now: int) -> tuple[str, str, bool] | None:
        """(status, summary, edited after) as of the settle moment, or None."""
        issue = self.issue()
        last = settled_change(issue, self.entries, SETTLE, at(now))
        if last is None:
            return None
        then = as_of(issue, self.entries, last, SETTLE)
        reading = read_result(then.issue, then.timeline, RULES, moment=last)
        result = reading.result
        return str(reading.status), result.summary, result.summary_edited_after_settle
