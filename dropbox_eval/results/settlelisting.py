"""SettlingListing: the issues of a visit's settling tasks that its listing did not show,
from one paged listing of the repo instead of one GET of each.

A settling task's issue is looked at on every visit until its result settles (reading.py
`settle_unlisted`), so that a deletion, a reopen or a change the visit's listing did not
show counts at once. A visit lists only what changed since the last one, so when a big
batch's issues close together, every visit of its settle window asked for each of them on
its own: a GET per settling task per visit. The issues listing with `since` the oldest
settling task's close shows each of those issues as its GET does (the same issue JSON:
a close and every later change move `updated_at`, which `since` filters on, inclusive, to
the second), in pages of 50; each listed issue is then `observe`d exactly as the GET's
answer was, judged by the visit's listing time as before. One the listing does not show
(deleted, its task label taken off, a clock the listing disagrees with) is still read on
its own. The listing is used only when it costs fewer requests than the GETs it saves
(one-item count first: `X-Total-Count`).

What no list replaces: the timeline of each issue whose settle time passed (reading.py
`_read`). Gitea has no repo-wide timeline: the label and close entries with their times
(the labels and the state as of the settle moment, the merge commit a close names) and the
pull-request references (`pull_ref`, from a pull request in any repo of the instance) are
served per issue only, and no list can prove that an issue has no such reference; the
repo-wide comments list holds comments only. So the result as of the settle moment still
costs one timeline read per issue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal

from ..config import Settings
from ..errors import ForgeError
from ..forge.client import PAGE_LIMIT, ForgeIssue, GiteaClient, UsesForge
from ..models import TaskRecord
from .opentasks import Owner
from .reading import ResultReader

log = logging.getLogger("dropbox_eval")

Mode = Literal["auto", "always", "never"]
Read = tuple[Owner, int, Callable[[], "dict[str, Any] | None"]]
OVERLAP = timedelta(seconds=1)  # `since` has whole seconds: the close's own second counts
FEWEST = 3  # below this many settling tasks a count and a page cost as much as their GETs


class SettlingListing(UsesForge):
    """Reads the settling tasks a visit's listing did not show, a listing's page at a time."""

    def __init__(self, gitea: GiteaClient | None, settings: Settings, reader: ResultReader) -> None:
        """`mode`: `auto` lists when that is cheaper than the GETs; `always` and `never`
        (tests: the two routes on one history) decide without counting."""
        self._gitea = gitea
        self.settings = settings
        self.reader = reader
        self.mode: Mode = "auto"

    def reads(
        self,
        repo: str,
        settling: list[int],
        owner_of: Callable[[int], Owner | None],
        seen: set[int],
    ) -> Iterator[Read]:
        """The reading of each settling task (its issue number in `settling`, its owner
        looked up with `owner_of` when its turn comes: the visit lets go of a task once its
        change is stored) the repo's issues listing since their oldest close shows, in the
        listing's order; each issue read is added to `seen`. Nothing when the GETs are
        cheaper; a forge error ends the listing (the tasks it did not show are then read on
        their own, as before)."""
        wanted = {number for number in settling if number not in seen}
        if not wanted or self.mode == "never":
            return
        since = min(_changed_since(owner_of, number) for number in wanted) - OVERLAP
        gitea = self.gitea
        kept = gitea.listed_at  # the visit's listing time: each reading is judged by it
        try:
            if self.mode == "auto" and not self._cheaper(repo, since, len(wanted)):
                return
            issues = gitea.iter_issues(
                repo, state="all", labels=self.settings.task_label, since=since
            )
            for issue in issues:
                owner = owner_of(issue.number) if issue.number in wanted else None
                if owner is None or issue.number in seen:
                    continue
                seen.add(issue.number)
                gitea.listed_at = kept
                yield (owner, issue.number, partial(self._observe, repo, owner[1], issue))
        except ForgeError as exc:
            log.warning("%s: settling issues not listed, read one by one: %s", repo, exc)
        finally:
            gitea.listed_at = kept

    def _cheaper(self, repo: str, since: datetime, settling: int) -> bool:
        """Whether the count and the listing's pages cost fewer requests than the GETs."""
        if settling < FEWEST:
            return False
        total = self.gitea.count_issues(
            repo, state="all", labels=self.settings.task_label, since=since
        )
        pages = max(1, -(-total // PAGE_LIMIT))
        return pages < settling

    def _observe(self, repo: str, task: TaskRecord, issue: ForgeIssue) -> dict[str, Any] | None:
        """What `ResultReader.settle_unlisted` makes of its GET, from the listed issue."""
        return self.reader.observe(repo, task, issue)


def _changed_since(owner_of: Callable[[int], Owner | None], number: int) -> datetime:
    """A time at or before the issue's `updated_at` as its task last saw it: its close
    (a reading's `changed_at` may be a comment's edit, which leaves `updated_at` alone)."""
    owner = owner_of(number)
    settling = owner[1].settling if owner is not None else None
    assert settling is not None
    return min(settling.changed_at, settling.closed_at or settling.changed_at)
