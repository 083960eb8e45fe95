"""Progress: how far a batch is, with the tasks whose result is still settling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..models import BatchStatus, TaskRecord, TaskStatus

ENDED_EARLY = (BatchStatus.CANCELLED, BatchStatus.EXPIRED, BatchStatus.FAILED)


@dataclass(frozen=True)
class Progress:
    """`done` tasks finished; `settling` closed by the lane, their result not final yet
    (README "Why settle"); `lane_done` finished by the lane (known when the tasks were
    read: a batch that ended early shows it instead of a full bar)."""

    status: BatchStatus
    total: int
    done: int
    settling: int = 0
    lane_done: int | None = None

    @classmethod
    def of(cls, status: BatchStatus | str, total: int, done: int, settling: int = 0) -> Progress:
        """From a record's or row's counters; an ended batch has nothing settling (its
        record may still carry the last count)."""
        status = BatchStatus(status)
        return cls(status, total, done, settling if status is BatchStatus.RUNNING else 0)

    @classmethod
    def from_tasks(cls, status: BatchStatus | str, tasks: list[TaskRecord]) -> Progress:
        """Counted from the tasks themselves."""
        status = BatchStatus(status)
        running = status is BatchStatus.RUNNING
        return cls(
            status,
            len(tasks),
            sum(1 for t in tasks if t.status.is_finished),
            sum(1 for t in tasks if running and t.status == TaskStatus.OPEN and t.settling),
            sum(1 for t in tasks if t.status.is_lane_verdict),
        )

    @classmethod
    def from_view(cls, view: dict[str, Any]) -> Progress:
        """Back from a view's `status` and `progress` (to draw its bar)."""
        data = view["progress"]
        return cls(
            BatchStatus(view["status"]),
            data["total"],
            data["done"],
            data["settling"],
            data["lane_done"],
        )

    @property
    def ended_early(self) -> bool:
        """Cancelled, expired or failed: the unfinished tasks were never done by the lane."""
        return self.status in ENDED_EARLY

    @property
    def shown_done(self) -> int:
        """What the bar fills: the finished tasks; for a batch that ended early, only those
        the lane finished (0 when that is unknown), never the tasks closed without its work."""
        if self.ended_early:
            return self.lane_done or 0
        return self.done

    @property
    def percent(self) -> int:
        """The bar's share, 0-100 (`shown_done`; an empty batch that did not end early is
        done)."""
        if not self.total:
            return 0 if self.ended_early else 100
        return round(100 * self.shown_done / self.total)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form every output shares."""
        return {
            "total": self.total,
            "done": self.done,
            "settling": self.settling,
            "waiting": self.total - self.done - self.settling,
            "lane_done": self.lane_done,
            "percent": self.percent,
            "text": self.text(),
        }

    def text(self) -> str:
        """`1/3 done, 2 settling`; `1/3 by the lane` for a batch that ended early (its
        unfinished tasks were cancelled, not done: its bar says how it ended instead)."""
        if self.ended_early:
            lane = "?" if self.lane_done is None else str(self.lane_done)
            return f"{lane}/{self.total} by the lane"
        shown = f"{self.done}/{self.total} done"
        return f"{shown}, {self.settling} settling" if self.settling else shown

    def bar(self, width: int = 10) -> str:
        """A plain-character bar: `#` done, `~` settling, `-` waiting."""
        if self.ended_early:
            return f"({self.status})"
        if not self.total:
            return "#" * width
        done = round(width * self.done / self.total)
        settling = min(width - done, round(width * self.settling / self.total))
        return "#" * done + "~" * settling + "-" * (width - done - settling)
