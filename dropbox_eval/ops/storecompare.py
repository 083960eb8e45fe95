"""Comparing two stores through the store contract alone, whatever their engines: what
each answers of the batch listing (rows, order, counts), every client with its whole
ledger, every batch's record, tasks, report bytes and tombstone, the audit log and the
running totals. `dropbox-eval migrate --from-files` runs it between the state folder it
copied and the database it filled; none is expected.

It reads every batch of both (the whole history): a one-off check, not a monitor's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel

from ..errors import NotFoundError
from ..models import BatchRecord, Client, LedgerEntry
from ..store import BatchRow, Store

SHOWN = 80  # characters of a value shown in a difference


@dataclass(frozen=True)
class Difference:
    """One thing the two stores answer differently: what about, and how."""

    subject: str
    problem: str

    def line(self) -> str:
        """One line for the operator."""
        return f"{self.subject}: {self.problem}"

    def as_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return asdict(self)


def compare_stores(
    first: Store,
    second: Store,
    *,
    names: tuple[str, str] = ("first store", "second store"),
    batch_ids: Iterable[str] = (),
) -> list[Difference]:
    """Every difference between what `first` and `second` answer. `names` say which is
    which in the messages; `batch_ids`: batches to compare besides the listed ones and
    those the ledgers name (a tombstone without a ledger entry)."""
    return _Comparison(first, second, names).run(set(batch_ids))


class _Comparison:
    def __init__(self, first: Store, second: Store, names: tuple[str, str]) -> None:
        self.stores = (first, second)
        self.names = names
        self.found: list[Difference] = []

    def run(self, batch_ids: set[str]) -> list[Difference]:
        listed = self._listing()
        named = self._clients()
        for batch_id in sorted(listed | named | batch_ids):
            self._batch(batch_id)
        self._audit()
        self._totals()
        return self.found

    def _differ(self, subject: str, problem: str) -> None:
        self.found.append(Difference(subject, problem))

    def _both(self, subject: str, what: str, a: Any, b: Any) -> None:
        if a != b:
            self._differ(subject, f"{what}: {self._values(a, b)}")

    def _values(self, a: Any, b: Any) -> str:
        return f"{_shown(a)} in the {self.names[0]}, {_shown(b)} in the {self.names[1]}"

    def _models(self, subject: str, a: BaseModel | None, b: BaseModel | None) -> None:
        """Field by field (times compared as instants, whatever their zone)."""
        if a is None or b is None:
            if (a is None) != (b is None):
                missing = self.names[0] if a is None else self.names[1]
                self._differ(subject, f"missing in the {missing}")
            return
        for name in type(a).model_fields:
            self._both(subject, name, getattr(a, name), getattr(b, name))

    def _sequences(self, subject: str, what: str, a: Sequence[Any], b: Sequence[Any]) -> None:
        """Two lists of models: their lengths, then their first differing item."""
        if len(a) != len(b):
            self._differ(subject, f"{what}s: {self._values(len(a), len(b))}")
        for n, (left, right) in enumerate(zip(a, b, strict=False)):
            if left != right:
                self._models(f"{subject}, {what} #{n + 1}", left, right)
                return

    def _listing(self) -> set[str]:
        """The rows of every batch, the listings' order, the counts; the listed ids."""
        rows = [{row.batch_id: row for row in s.list_batches()} for s in self.stores]
        for batch_id in sorted(rows[0].keys() | rows[1].keys()):
            self._models(f"batch {batch_id} (listed)", rows[0].get(batch_id), rows[1].get(batch_id))
        every = len(rows[0]) + len(rows[1]) + 1
        pages = [[row.batch_id for row in s.page_batches(limit=every)] for s in self.stores]
        if pages[0] != pages[1] and set(pages[0]) == set(pages[1]):
            at = next(n for n, (a, b) in enumerate(zip(*pages, strict=True)) if a != b)
            self._differ(
                "the batch listing",
                f"order differs from row {at + 1}: {self._values(pages[0][at], pages[1][at])}",
            )
        clients = sorted({row.client_id for side in rows for row in side.values()})
        for client_id in [None, *clients]:
            subject = "batch counts" + (f" of {client_id}" if client_id else "")
            a, b = (s.count_batches(client_id) for s in self.stores)
            self._both(subject, "per status", _nonzero(a), _nonzero(b))
        return set(rows[0]) | set(rows[1])

    def _clients(self) -> set[str]:
        """Every client and its whole ledger; the batch ids the ledgers name."""
        clients: list[dict[str, Client]] = [
            {c.client_id: c for c in s.list_clients()} for s in self.stores
        ]
        named: set[str] = set()
        for client_id in sorted(clients[0].keys() | clients[1].keys()):
            subject = f"client {client_id}"
            self._models(subject, clients[0].get(client_id), clients[1].get(client_id))
            ledgers: list[list[LedgerEntry]] = [s.ledger(client_id) for s in self.stores]
            self._sequences(subject, "ledger entry", *ledgers)
            named |= {e.batch_id for ledger in ledgers for e in ledger if e.batch_id}
        return named

    def _batch(self, batch_id: str) -> None:
        """Its record, tasks, report bytes and tombstone."""
        subject = f"batch {batch_id}"
        records = [_record(s, batch_id) for s in self.stores]
        self._models(subject, *records)
        if records[0] is not None and records[1] is not None:
            tasks = [s.get_tasks(batch_id) for s in self.stores]
            self._sequences(subject, "task", *tasks)
        reports = [s.get_report(batch_id) for s in self.stores]
        if reports[0] != reports[1]:
            sizes = [None if r is None else f"{len(r)} bytes" for r in reports]
            self._differ(subject, f"report: {self._values(*sizes)}")
        self._both(subject, "tombstone", *(s.tombstone(batch_id) for s in self.stores))

    def _audit(self) -> None:
        entries = [s.audit_entries() for s in self.stores]
        self._sequences("the audit log", "entry", *entries)

    def _totals(self) -> None:
        """What the archive adds up to, the live ledger and the live rows."""
        a, b = (s.snapshot() for s in self.stores)
        for what in ("batches", "tasks", "sources", "charged"):
            left, right = getattr(a.archived, what), getattr(b.archived, what)
            self._both("the archive's totals", what, _nonzero(left), _nonzero(right))
        bad = [[BatchRow.model_validate(r) for r in s.archived.recent_bad] for s in (a, b)]
        self._both("the archive's totals", "recent failed or expired", *bad)
        live = [sorted(str(e["entry_id"]) for e in s.ledger) for s in (a, b)]
        self._both("the live ledger", "entries", *live)
        rows = [sorted(str(r["batch_id"]) for r in s.live) for s in (a, b)]
        self._both("the live batches", "ids", *rows)


def _record(store: Store, batch_id: str) -> BatchRecord | None:
    try:
        return store.get_batch(batch_id)
    except NotFoundError:
        return None


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}..."
