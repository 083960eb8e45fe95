"""How the simulated lane behaves (`LaneConfig`) and which issues it may touch (`LaneGate`)."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

LaneMode = Literal["labels", "pulls"]
LANE_MODES: tuple[LaneMode, ...] = ("labels", "pulls")


@dataclass(frozen=True)
class LaneConfig:
    """Lane settings. `labels`: verdict comment + label, then close (today's lane).
    `pulls`: status comment, PR `Closes #N`, then merge (share `merge_ratio`) or abandon
    `merge_delay` seconds later; `close_first` closes before the verdict label+comment,
    which follow `comment_lag` seconds later."""

    mode: LaneMode = "labels"
    delay: float = 5.0
    interval: float = 0.1
    merge_ratio: float = 1.0
    merge_delay: float = 0.0
    close_first: bool = False
    comment_lag: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in LANE_MODES:
            raise ValueError(f"lane mode must be one of {', '.join(LANE_MODES)}: {self.mode!r}")
        if not 0.0 <= self.merge_ratio <= 1.0:
            raise ValueError(f"merge_ratio must lie in [0, 1]: {self.merge_ratio}")
        if min(self.delay, self.merge_delay, self.comment_lag) < 0 or self.interval <= 0:
            raise ValueError("lane delays must be >= 0 and the interval > 0")

    def with_changes(self, changes: dict[str, Any]) -> LaneConfig:
        """A copy with `changes` applied; unknown keys or bad values -> ValueError."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown lane settings: {', '.join(unknown)}")
        return replace(self, **changes)

    def to_json(self) -> dict[str, object]:
        """Render as a plain dict."""
        return asdict(self)


Key = tuple[str, ...]


class LaneGate:
    """Holds and releases: the finest rule wins (issue, then repo, then everyone)."""

    def __init__(self, *, hold_all: bool = False) -> None:
        self._lock = threading.Lock()
        self._all = hold_all
        self._rules: dict[Key, bool] = {}

    def hold(
        self, owner: str | None = None, repo: str | None = None, number: int | None = None
    ) -> None:
        """Stop the lane on one issue, one repo, or (no arguments) everywhere."""
        self._set(True, owner, repo, number)

    def release(
        self, owner: str | None = None, repo: str | None = None, number: int | None = None
    ) -> None:
        """Let the lane work on one issue, one repo, or (no arguments) everywhere."""
        self._set(False, owner, repo, number)

    def _set(self, held: bool, owner: str | None, repo: str | None, number: int | None) -> None:
        with self._lock:
            if owner is None or repo is None:
                self._all = held
                self._rules.clear()
                return
            self._rules[_key(owner, repo, number)] = held

    def is_held(self, owner: str, repo: str, number: int) -> bool:
        """Whether the lane must leave issue `owner/repo#number` alone for now."""
        with self._lock:
            for key in (_key(owner, repo, number), _key(owner, repo, None)):
                if key in self._rules:
                    return self._rules[key]
            return self._all

    def to_json(self) -> dict[str, object]:
        """`{"all": bool, "rules": [{"target": "o/r" or "o/r#n", "held": bool}]}`."""
        with self._lock:
            rules = [
                {"target": "/".join(k[:2]) + (f"#{k[2]}" if len(k) > 2 else ""), "held": held}
                for k, held in self._rules.items()
            ]
            return {"all": self._all, "rules": rules}


def _key(owner: str, repo: str, number: int | None) -> Key:
    base = (owner.lower(), repo.lower())
    return base if number is None else (*base, str(number))
