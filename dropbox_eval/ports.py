"""What one stage needs of another, as types: the stages never import each other (the
workers and the composition root, app.py, hand each the others' callables)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from .models import BatchFile, BatchRecord, BatchStatus, TaskRecord


class Accepting(Protocol):
    """The intake, as the inbox uses it."""

    def accept(
        self,
        batch: BatchFile,
        client_id: str,
        *,
        source: str | None = None,
        sha256: str | None = None,
        open_now: bool = True,
    ) -> dict[str, Any]:
        """Record a batch (or find its duplicate); the receipt."""
        ...

    def filed(self, receipt: dict[str, Any]) -> None:
        """Store that the drop sits beside its receipt."""
        ...


class Closing(Protocol):
    """The settle stage, as the poller and the lifecycle use it."""

    def __call__(
        self,
        batch_id: str,
        tasks: list[TaskRecord],
        status: BatchStatus,
        *,
        polled_at: datetime | None = None,
        failure: str | None = None,
    ) -> BatchRecord:
        """End a running batch once: charge, release, final status, fixed report."""
        ...


class PollingOne(Protocol):
    """The poll stage, as the lifecycle uses it before closing a batch's issues."""

    def __call__(self, batch_id: str, *, full: bool = False) -> list[str]:
        """Store the results of the issues the lane closed; the finished task ids."""
        ...


class ReadingNow(Protocol):
    """The poll stage's reader, as the lifecycle uses it for a batch ending early."""

    def __call__(self, repo: str, task: TaskRecord) -> dict[str, Any]:
        """The final change of a settling task, read now."""
        ...
