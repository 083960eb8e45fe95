"""The engine's stored rows: a record's summary row and the index's numbered tables."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..models import BatchRecord, BatchStatus


class BatchRow(BaseModel):
    """A batch as listings show it: the summary fields of its record."""

    model_config = ConfigDict(frozen=True)

    batch_id: str
    client_id: str
    batch_ref: str | None = None
    status: BatchStatus
    total: int
    done: int = 0
    repo: str
    sha256: str | None = None
    source: str | None = None
    created_at: datetime
    completed_at: datetime | None = None
    emitted_at: datetime | None = None

    @classmethod
    def of(cls, batch: BatchRecord) -> BatchRow:
        """The row of a batch record."""
        return cls.model_validate(batch.model_dump(include=set(SUMMARY_FIELDS)))

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready fields (times in ISO 8601)."""
        data: dict[str, Any] = self.model_dump(mode="json")
        return data


SUMMARY_FIELDS = tuple(BatchRow.model_fields)


class HistoryPage(BaseModel):
    """One page of archived batches and the cursor of the next (None: the last page)."""

    model_config = ConfigDict(frozen=True)

    rows: list[BatchRow]
    next_cursor: str | None = None


Row = dict[str, Any]


def summary_row(batch: Any) -> Row:
    """A batch's index row: the summary fields of its record (the record owns them)."""
    data = dump(batch)
    return {key: data[key] for key in SUMMARY_FIELDS}


def dump(model: Any) -> Row:
    """A model as stored (JSON-ready)."""
    data: Row = model.model_dump(mode="json")
    return data


def insert(table: dict[str, Any], doc: Row) -> None:
    """Add `doc` to a TinyDB table under the next number."""
    next_id = max((int(key) for key in table), default=0) + 1
    table[str(next_id)] = doc


def encode(value: Any) -> Any:
    """A field's value as stored."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def duplicate_keys(sha256: str | None, batch_ref: str | None) -> list[str]:
    """The names under `keys/<client_id>/` that find a batch by its bytes or its ref."""
    return ([f"sha256-{sha256}"] if sha256 else []) + ([f"ref-{batch_ref}"] if batch_ref else [])
