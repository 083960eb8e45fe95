"""The engine's stored rows: a record's summary row and the index's numbered tables."""

from __future__ import annotations

from typing import Any

from .contract import SUMMARY_FIELDS

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
