"""Deleting an ended batch, and the retention prune that deletes them once they are old.

A delete keeps a tombstone (id, client, status, dates, task counts, charge) and removes
the rest: the report in the outbox (and its undelivered copy), the accepted drop and its
receipt, the batch's record and tasks (store: `erase_batch`). Money is never removed:
the ledger keeps every entry, and the client's balance and held credits do not move (a
batch whose final charge a crash left unposted is settled first, as the state check
would). Write order: the settlement if missing, the files outside the state folder, then
the store's one switch from the batch to its tombstone; a delete cut short leaves the
batch readable (its report kept beside its record), and deleting it again finishes.

`prune` deletes every batch that ended before the cutoff (`SAAS_EVAL_RETENTION_DAYS`, or
`--older-than`) and removes the rejected drops, their error files and the accepted cancel
requests filed before it. It reads the whole history once (a daily job, not a request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..billing.accounts import Billing
from ..config import Settings
from ..errors import DropboxEvalError, InvalidArgument, NotFinished, NotFoundError, answer_for
from ..models import BatchRecord, BatchStatus, is_valid_id
from ..protocol.report import status_counts
from ..store import Store
from ..util.timestamps import now, parse, rfc3339, utcnow
from . import dropfiles

log = logging.getLogger("dropbox_eval")
DAY = timedelta(days=1)
Audit = Callable[[str, str, str, dict[str, Any]], None]  # action, target, result, detail


@dataclass
class Pruned:
    """What a prune removed (or, `dry_run`, would remove)."""

    cutoff: str
    dry_run: bool
    batches: list[str] = field(default_factory=list)
    files: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # batch id -> why it stayed

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "ok": not self.failed,
            "cutoff": self.cutoff,
            "dry_run": self.dry_run,
            "batches": self.batches,
            "files": self.files,
            "failed": self.failed,
        }


class Retention:
    """Deletes ended batches, one by one or past the retention."""

    def __init__(
        self, store: Store, billing: Billing, settings: Settings, audit: Audit | None = None
    ) -> None:
        """`audit(action, target, result, detail)` records each delete and prune (the
        operator's; a client's own delete through the API too)."""
        self.store = store
        self.billing = billing
        self.settings = settings
        self.audit = audit

    def delete(self, batch_id: str, *, client_id: str | None = None) -> dict[str, Any]:
        """Delete an ended batch (with `client_id`, only that client's: another's is
        unknown); returns its tombstone. A running batch is NotFinished (409); a batch
        deleted already answers its tombstone again."""
        if not is_valid_id(batch_id):  # no batch's id: nothing to record (a client's
            # junk ids would grow the audit log, which is never pruned)
            raise NotFoundError(f"no batch {batch_id!r}")
        asked = {"client_id": client_id} if client_id else {}
        try:
            tombstone = self._delete(batch_id, client_id, by="client" if client_id else "operator")
        except DropboxEvalError as exc:
            self._record("delete", batch_id, answer_for(exc)[2], asked)
            raise
        self._record("delete", batch_id, "ok", {"client_id": tombstone["client_id"]})
        return tombstone

    def _delete(self, batch_id: str, client_id: str | None, *, by: str) -> dict[str, Any]:
        try:
            batch = self.store.get_batch(batch_id)
        except NotFoundError:
            buried = self.store.tombstone(batch_id)
            if buried is None or client_id not in (None, buried.get("client_id")):
                raise
            return buried
        if client_id is not None and batch.client_id != client_id:
            raise NotFoundError(f"no batch {batch_id!r}")
        if not batch.status.is_finished:
            raise NotFinished(
                f"batch {batch_id} is running: cancel it first, then delete it",
                status=batch.status,
            )
        self._settle(batch)
        tombstone = self._tombstone(batch, by)
        dropfiles.remove(self._files(batch))
        self.store.erase_batch(batch, tombstone)
        log.info("batch %s: deleted (%s); its tombstone stays", batch_id, by)
        return tombstone

    def _settle(self, batch: BatchRecord) -> None:
        """Post the final charge of an ended batch whose close a crash cut short (only
        while it is live: an archived batch took its settlement with it)."""
        if self.store.list_batches(live_only=True, batch_id=batch.batch_id):
            entries = self.billing.final_charge(
                batch.client_id, batch.batch_id, batch.cost, batch.charged or 0
            )
            self.store.settle(entries)

    def _tombstone(self, batch: BatchRecord, by: str) -> dict[str, Any]:
        try:
            counts = status_counts(self.store.get_tasks(batch.batch_id))
        except NotFoundError:
            counts = {"total": batch.total}
        return {
            "batch_id": batch.batch_id,
            "client_id": batch.client_id,
            "status": str(batch.status),
            "deleted": True,
            "deleted_by": by,
            "created_at": rfc3339(batch.created_at),
            "completed_at": rfc3339(batch.completed_at),
            "emitted_at": rfc3339(batch.emitted_at),
            "deleted_at": now(),
            "counts": counts,
            "cost": batch.cost,
            "charged": batch.charged,
            "retry_of": batch.retry_of,
            "retried_by": batch.retried_by,
        }

    def _files(self, batch: BatchRecord) -> list[Any]:
        return dropfiles.report_files(
            self.settings.outbox_path, batch.batch_id
        ) + dropfiles.filed_drop(self.settings.inbox_path, batch.source, batch.batch_id)

    def cutoff(self, older_than_days: float | None = None) -> datetime | None:
        """The moment before which ended batches are pruned: `older_than_days` ago, else
        the retention's; None when retention is off (0) and no age was given."""
        if older_than_days is not None:
            return utcnow() - older_than_days * DAY
        days = self.settings.retention_days
        return utcnow() - days * DAY if days > 0 else None

    def prune(self, older_than_days: float | None = None, *, dry_run: bool = False) -> Pruned:
        """Delete the batches that ended before the cutoff (`cutoff`), and remove the
        rejected drops and accepted cancel requests filed before it; keeps tombstones and
        every ledger entry."""
        cutoff = self.cutoff(older_than_days)
        if cutoff is None:
            raise InvalidArgument(
                "retention is off (SAAS_EVAL_RETENTION_DAYS=0): give the age, --older-than DAYS"
            )
        result = Pruned(cutoff=str(rfc3339(cutoff)), dry_run=dry_run)
        for row in self.store.list_batches():
            ended = row.completed_at or row.created_at
            if row.status is BatchStatus.RUNNING or parse(ended) >= cutoff:
                continue
            if self.store.tombstone(row.batch_id) is not None:
                continue  # deleted before
            if dry_run:
                result.batches.append(row.batch_id)
                continue
            try:
                self._delete(row.batch_id, None, by="retention")
                result.batches.append(row.batch_id)
            except DropboxEvalError as exc:  # one batch's trouble must not stop the prune
                log.warning("prune: batch %s stays: %s", row.batch_id, exc)
                result.failed[row.batch_id] = str(exc)
        old = dropfiles.old_filed(self.settings.inbox_path, cutoff.timestamp())
        result.files = len(old) if dry_run else dropfiles.remove(old)
        if not dry_run:
            detail = {"batches": len(result.batches), "files": result.files}
            self._record("prune", "-", "ok" if not result.failed else "partial", detail)
            log.info(
                "prune: %d batches deleted, %d filed drops removed (ended or filed before %s)",
                len(result.batches),
                result.files,
                result.cutoff,
            )
        return result

    def _record(self, action: str, target: str, result: str, detail: dict[str, Any]) -> None:
        """AUDIT: the one call site of the audit log for `delete` and `prune`."""
        if self.audit is not None:
            self.audit(action, target, result, detail)
