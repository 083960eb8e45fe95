"""Labels on Gitea/Forgejo, which lets one name repeat.

Label names are not unique on Gitea, and the issue list's `labels` filter takes names only
(an id is read as an unknown name), ANDs the ids of every label with that name, and drops the
filter altogether when no name matches. So labels are created under a lock (a file lock when
`label_lock` is given) after listing them, the oldest (lowest id) is kept, and duplicates are
merged into it (their issues get the oldest label, then they are deleted). A filtered list
that comes back empty checks for duplicates once and repairs them, and filtered results are
re-checked on the client so an unknown name never lets every issue through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from filelock import Timeout as LockTimeout

from ..errors import ForgeNotFound, ForgePermanent, ForgeRetryable
from .transport import ForgeTransport


class ForgeLabels(ForgeTransport):
    """Creating, finding and merging labels, and labelling issues."""

    def ensure_label(self, repo: str, name: str, color: str) -> int:
        """The id of label `name` in `repo`, created if missing. Duplicates (Gitea allows
        them) are merged into the oldest, whose id is returned."""
        with self._labels_locked():
            ids = self._label_ids(repo, name)
            if not ids:
                created = self._request(
                    "POST", f"/repos/{repo}/labels", json={"name": name, "color": color}
                )
                # re-list: a creator that does not share our lock may have raced us
                ids = self._label_ids(repo, name) or [int(created["id"])]
            if len(ids) > 1:
                self._merge_labels(repo, ids[0], ids[1:])
            return ids[0]

    def repair_label(self, repo: str, name: str) -> bool:
        """Merge duplicates of label `name` into the oldest; True when there were any."""
        with self._labels_locked():
            ids = self._label_ids(repo, name)
            if len(ids) > 1:
                self._merge_labels(repo, ids[0], ids[1:])
            return len(ids) > 1

    @contextmanager
    def _labels_locked(self) -> Iterator[None]:
        try:
            with self._label_lock:
                yield
        except LockTimeout as exc:
            raise ForgeRetryable(f"label lock {exc.lock_file} busy; retried later") from exc

    def _label_ids(self, repo: str, name: str) -> list[int]:
        """Ids of the repo labels called `name`, oldest first (all labels: no `page`)."""
        labels = self._request("GET", f"/repos/{repo}/labels")
        try:
            return sorted(int(lab["id"]) for lab in labels if lab.get("name") == name)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ForgePermanent(f"unexpected labels JSON from forge: {exc}") from exc

    def _merge_labels(self, repo: str, keep: int, extras: list[int]) -> None:
        """Give `keep` to every issue carrying one of `extras`, then delete `extras`. A crash
        half-way leaves duplicates that the next call merges again."""
        listed_at, extra = self.listed_at, set(extras)
        for page in self._pages(f"/repos/{repo}/issues", {"state": "all", "type": "issues"}):
            for number, ids in map(_number_and_label_ids, page):
                if ids & extra and keep not in ids:
                    self.add_labels(repo, number, [keep])
        for label_id in extras:
            with suppress(ForgeNotFound):  # another process merged it first
                self._request("DELETE", f"/repos/{repo}/labels/{label_id}")
        self.listed_at = listed_at

    def add_labels(self, repo: str, number: int, label_ids: list[int]) -> None:
        """Add labels (by id) to an issue."""
        self._request("POST", f"/repos/{repo}/issues/{number}/labels", json={"labels": label_ids})

    def _repair_labels(self, repo: str, names: frozenset[str]) -> bool:
        return any([self.repair_label(repo, name) for name in sorted(names)])


def label_names(labels: str | None) -> frozenset[str]:
    """The names of a comma-separated `labels` filter."""
    return frozenset(name.strip() for name in (labels or "").split(",") if name.strip())


def _number_and_label_ids(item: Any) -> tuple[int, set[int]]:
    try:
        return int(item["number"]), {int(lab["id"]) for lab in item.get("labels") or []}
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ForgePermanent(f"unexpected issue JSON from forge: {exc}") from exc
