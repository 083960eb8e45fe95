"""Running totals of the archive, for metrics and the operator's page.

Archived batches never change, so what they add up to (tasks per status, batches per way
in, credits charged per client, the newest failed or expired batches) is added to the
index's `counts` document in the same atomic write that archives each batch. Readers then
add the live batches, read one by one, and never read the history. A state folder archived
by a version without these totals is summed from the archive once (`backfill`), under the
store lock, the first time they are needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
VERSION = 1
RECENT_BAD = 20  # failed or expired archived batches kept for the operator's page
BAD_STATUSES = ("failed", "expired")


@dataclass
class ArchivedTotals:
    """What every archived batch adds up to."""

    batches: dict[str, int] = field(default_factory=dict)  # per status
    tasks: dict[str, int] = field(default_factory=dict)  # per task status
    sources: dict[str, int] = field(default_factory=dict)  # "inbox" / "api"
    charged: dict[str, int] = field(default_factory=dict)  # per client
    recent_bad: list[Row] = field(default_factory=list)  # summary rows, oldest first


@dataclass
class Snapshot:
    """One read of the index: live batch rows, live ledger, clients and archived totals."""

    live: list[Row]
    ledger: list[Row]
    clients: list[Row]
    archived: ArchivedTotals


def source_of(row: Row) -> str:
    """How a batch came: "inbox" (a dropped file's path), "api" (none, or "api") or
    "retry" (`dropbox-eval retry`, retry.py)."""
    source = row.get("source")
    if source == "retry":
        return "retry"
    return "inbox" if source and source != "api" else "api"


def charged_by(entries: Iterable[Row]) -> dict[str, int]:
    """Credits charged per client by these ledger entries."""
    charged: dict[str, int] = {}
    for entry in entries:
        if entry.get("kind") == "charge":
            client = str(entry["client_id"])
            charged[client] = charged.get(client, 0) - int(entry["amount"])
    return charged


def task_counts(tasks: Iterable[Row]) -> dict[str, int]:
    """Tasks per status."""
    counts: dict[str, int] = {}
    for task in tasks:
        counts[str(task["status"])] = counts.get(str(task["status"]), 0) + 1
    return counts


def has_totals(counts_doc: Row) -> bool:
    """Whether the index's counts document already carries the running totals."""
    return bool(counts_doc.get("totals", {}).get("version") == VERSION)


def read(counts_doc: Row) -> ArchivedTotals:
    """The totals kept in the index's counts document."""
    kept = counts_doc.get("totals", {})
    return ArchivedTotals(
        batches=dict(counts_doc.get("all", {})),
        tasks=dict(kept.get("tasks", {})),
        sources=dict(kept.get("sources", {})),
        charged=dict(kept.get("charged", {})),
        recent_bad=list(kept.get("recent_bad", [])),
    )


def add(counts_doc: Row, summary: Row, tasks: dict[str, int], entries: list[Row]) -> None:
    """Add one batch being archived (its summary row, task counts, ledger entries); the
    per-status batch counts are the store's own (`_count`)."""
    kept = counts_doc.setdefault("totals", {"version": VERSION})
    _merge(kept.setdefault("tasks", {}), tasks)
    _merge(kept.setdefault("sources", {}), {source_of(summary): 1})
    _merge(kept.setdefault("charged", {}), charged_by(entries))
    if summary["status"] in BAD_STATUSES:
        kept["recent_bad"] = [*kept.get("recent_bad", []), summary][-RECENT_BAD:]


def backfill(
    counts_doc: Row,
    archived: list[Row],
    tasks_of: Callable[[str], list[Row]],
    ledger: Iterable[Row],
    live_ids: set[str],
) -> None:
    """Sum an archive that has no running totals yet, once (reads the whole history),
    per-status batch counts included. Rows of batches still live (a crash between
    appending and archiving) are skipped: they are counted as live, and again when
    archived."""
    totals: Row = {"version": VERSION}
    for scope in [k for k in counts_doc if k == "all" or k.startswith("client:")]:
        del counts_doc[scope]  # summed again too, from the same rows
    counts_doc["totals"] = totals
    for row in archived:
        if row["batch_id"] in live_ids:
            continue
        for scope in ("all", f"client:{row['client_id']}"):
            _merge(counts_doc.setdefault(scope, {}), {str(row["status"]): 1})
        add(counts_doc, row, task_counts(tasks_of(str(row["batch_id"]))), [])
    entries = [e for e in ledger if e.get("batch_id") not in live_ids]
    _merge(totals.setdefault("charged", {}), charged_by(entries))


def _merge(into: dict[str, int], counts: dict[str, int]) -> None:
    for name, count in counts.items():
        into[name] = into.get(name, 0) + count
