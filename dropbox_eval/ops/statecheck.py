"""The state check: the invariants between the state's files, checked at every start, on
every full reconciliation and by `dropbox-eval check`.

Each fact has one owner: the batch record owns status, completion, charges and delivery;
the ledger owns money; the index rows are a cache of the records. A kill between the
writes of one change leaves the owners ahead of what derives from them, never behind
(the write orders are listed in the README's "Crash safety"), so the check repairs by
rewriting the derived copy from its owner:

- an index row that disagrees with its record is rewritten from the record;
- a record the index never named (an intake killed before its committing write) is
  removed; an emitted record left in the live folder finishes its move to the archive;
- a finished batch still holding credits gets its final charge, from its record's charge;
- a finished, unreported batch with no next delivery gets one now.

What no owner can settle (a row whose record is gone, a running batch whose hold is
missing, a client whose `held` is not the sum of its holds) is reported, never guessed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..billing.accounts import Billing
from ..errors import NotFoundError
from ..models import BatchRecord, BatchStatus, utcnow
from ..store import BatchRow, Store
from ..store.totals import Snapshot

log = logging.getLogger("dropbox_eval")


@dataclass(frozen=True)
class Finding:
    """One disagreement: what it is about, what is wrong, and what repairs it ("" when
    nothing can: an operator must look)."""

    subject: str
    problem: str
    repair: str
    repaired: bool = False

    @property
    def repairable(self) -> bool:
        """Whether the check can put it right from the owner of the fact."""
        return bool(self.repair)

    def as_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready fields."""
        return {**asdict(self), "repairable": self.repairable}


class StateCheck:
    """Compares the index, the records and the ledger; repairs what an owner settles."""

    def __init__(self, store: Store, billing: Billing, delivery_max_attempts: int) -> None:
        self.store = store
        self.billing = billing
        self.delivery_max_attempts = delivery_max_attempts

    def run(self, *, repair: bool) -> list[Finding]:
        """Every finding; with `repair`, each repairable one is repaired (under the store
        lock, after reading its batch again) and logged once."""
        findings: list[Finding] = []
        snapshot = self.store.snapshot()  # one read of the index for the first look
        for batch_id in self._suspects(snapshot):
            findings.extend(self._check_batch(batch_id, repair))
        findings.extend(_check_clients(snapshot))
        for finding in findings:
            level = logging.WARNING if finding.repaired else logging.ERROR
            if finding.repairable and not finding.repaired:
                level = logging.INFO  # a read-only check: the next start repairs it
            log.log(
                level, "state check: %s: %s%s", finding.subject, finding.problem, _tail(finding)
            )
        return findings

    def _suspects(self, snapshot: Snapshot) -> list[str]:
        """Batches whose files disagree on a first, unlocked look (the common case is none;
        each suspect is looked at again under the lock)."""
        rows = {str(row["batch_id"]): row for row in snapshot.live}
        held = _held_by(snapshot.ledger, "batch_id")
        suspects = set(self.store.stored_batch_ids()) ^ set(rows)
        for batch_id, row in rows.items():
            if batch_id in suspects:
                continue
            try:
                batch = self.store.get_batch(batch_id)
            except NotFoundError:
                suspects.add(batch_id)
                continue
            holds = held.get(batch_id, 0)
            running_unheld = batch.status == BatchStatus.RUNNING and holds != batch.cost
            if BatchRow.of(batch).as_dict() != row or running_unheld or self._problem(batch, holds):
                suspects.add(batch_id)
        return sorted(suspects)

    def _check_batch(self, batch_id: str, repair: bool) -> list[Finding]:
        with self.store.transaction():  # no change of its own: repairs are single writes
            rows = self.store.list_batches(live_only=True, batch_id=batch_id)
            try:
                batch = self.store.get_batch(batch_id)
            except NotFoundError:
                return [_gone(batch_id)] if rows else []
            subject = f"batch {batch_id}"
            if not rows:
                if self.store.being_recorded(batch_id):  # an intake before its commit
                    return []
                if batch_id not in self.store.stored_batch_ids():  # archived since the
                    return []  # first look (a service beside the check): nothing is wrong
                return [self._unnamed(subject, batch, repair)]
            findings = []
            if BatchRow.of(batch) != rows[0]:
                findings.append(self._fix_row(subject, batch, rows[0], repair))
            held = _held_by(self.store.snapshot().ledger, "batch_id").get(batch_id, 0)
            if batch.status == BatchStatus.RUNNING and held != batch.cost:
                findings.append(
                    Finding(subject, f"running, but {held} of its {batch.cost} credits held", "")
                )
            problem = self._problem(batch, held)
            if problem is not None:
                findings.append(self._fix(subject, problem[0], problem[1], repair, problem[2]))
            return findings

    def _unnamed(self, subject: str, batch: BatchRecord, repair: bool) -> Finding:
        if batch.emitted_at is not None:
            return self._fix(
                subject,
                "emitted, its record still in the live folder",
                "finish its move to the archive",
                repair,
                lambda: self.store.archive(batch),
            )
        return self._fix(
            subject,
            "a record the index never named (an intake killed before it was committed)",
            "remove its files (the drop is read again; no credits were held)",
            repair,
            lambda: self.store.drop_unrecorded(batch.batch_id),
        )

    def _fix_row(self, subject: str, batch: BatchRecord, row: BatchRow, repair: bool) -> Finding:
        fresh, stale = BatchRow.of(batch).as_dict(), row.as_dict()
        fields = ", ".join(
            f"{key} {stale[key]!r} -> {fresh[key]!r}" for key in fresh if stale[key] != fresh[key]
        )
        return self._fix(
            subject,
            f"index row disagrees with the record ({fields})",
            "rewrite the row from the record",
            repair,
            lambda: self.store.refresh_row(batch),
        )

    def _problem(
        self, batch: BatchRecord, held: int
    ) -> tuple[str, str, Callable[[], object]] | None:
        """Money or delivery that the record says should have moved on."""
        finished = batch.status != BatchStatus.RUNNING
        if finished and held:
            settlement = self.billing.final_charge(
                batch.client_id, batch.batch_id, held, batch.charged or 0
            )
            return (
                f"{batch.status} but {held} credits still held",
                f"settle from the record (charge {batch.charged or 0}, release {held})",
                lambda: self.store.settle(settlement),
            )
        if stranded(batch, self.delivery_max_attempts):
            return (
                "finished and unreported, with no next delivery",
                "schedule its delivery now",
                lambda: self.store.update_batch(batch.batch_id, next_delivery_at=utcnow()),
            )
        return None

    def _fix(
        self,
        subject: str,
        problem: str,
        action: str,
        repair: bool,
        apply: Callable[[], object],
    ) -> Finding:
        if repair:
            apply()
        return Finding(subject, problem, action, repaired=repair)


def stranded(batch: BatchRecord, delivery_max_attempts: int) -> bool:
    """A finished, unreported batch with no next delivery though it has automatic tries
    left (a try killed between its writes): the check schedules one, no person needed."""
    return (
        batch.status != BatchStatus.RUNNING
        and batch.emitted_at is None
        and batch.delivery_attempts > 0
        and batch.next_delivery_at is None
        and batch.delivery_attempts < delivery_max_attempts
    )


def _held_by(ledger: list[dict[str, Any]], key: str) -> dict[str, int]:
    """Credits held per `key` of the live ledger entries (`batch_id` or `client_id`)."""
    held: dict[str, int] = {}
    for entry in ledger:
        if entry.get(key):
            held[entry[key]] = held.get(entry[key], 0) + entry["held_change"]
    return held


def _check_clients(snapshot: Snapshot) -> list[Finding]:
    """Each client's `held` is the sum of its live holds (posted in the same writes)."""
    sums = _held_by(snapshot.ledger, "client_id")
    return [
        Finding(
            f"client {client['client_id']}",
            f"holds {client.get('held', 0)} credits but its ledger holds "
            f"{sums.get(client['client_id'], 0)}",
            "",
        )
        for client in snapshot.clients
        if client.get("held", 0) != sums.get(client["client_id"], 0)
    ]


def _gone(batch_id: str) -> Finding:
    return Finding(
        f"batch {batch_id}",
        "the index names it but its record is gone (restore state/batches/"
        f"{batch_id}.json from a backup)",
        "",
    )


def _tail(finding: Finding) -> str:
    if not finding.repairable:
        return " (cannot be repaired: an operator must look)"
    return f"; {'repaired' if finding.repaired else 'to repair'}: {finding.repair}"
