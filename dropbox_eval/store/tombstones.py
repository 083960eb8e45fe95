"""Erasing a batch: what a delete or the retention prune removes of it in the state folder,
and the tombstone that stays in its place in the history (history.py).

An ended batch still in the index first leaves it as an emitted batch does (`archive`:
its row and ledger entries go to the archive, the money untouched; its record and tasks
become one history entry). Then it is buried (`bury_batch`: its listing rows hidden, its
history entry replaced by its tombstone, no longer counted), the tombstone being what a
deleted batch keeps (id, client, status, dates, task counts, charge), and its duplicate
keys go, so the same bytes dropped again make a new batch.

A burial starts with one index write that uncounts the batch and notes the burial under
way (`BURYING`: the client and the whole tombstone); the listing rows' tombstones and the
history's follow, and one index write ends the note. Burying again after a crash finishes
from the note (the batch is no longer readable then), so it is uncounted once and its
tombstone is written once, whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError
from ..models import BatchRecord, is_valid_id, utcnow
from ..util import crashpoints
from .archiving import count_archived
from .files import unlink_quietly
from .rows import duplicate_keys

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others

BURYING = "burying"  # in the index's counts document: batch_id -> the burial under way


class Tombstones(_Base):
    """Erasing an ended batch for good, leaving its tombstone."""

    if TYPE_CHECKING:

        def archive(self, batch: BatchRecord) -> None:
            """Move a batch out of the index (archiving.py)."""

        def get_batch(self, batch_id: str) -> BatchRecord:
            """The batch record (engine.py)."""

    def tombstone(self, batch_id: str) -> dict[str, Any] | None:
        """The tombstone of an erased batch; None when it was not erased."""
        if not is_valid_id(batch_id):
            return None
        return self.history.tombstone(batch_id)

    def bury_batch(self, batch_id: str, *, reason: str, keep: dict[str, Any] | None = None) -> bool:
        """Replace an archived batch by its tombstone (contract.py): `keep`, else a bare
        one (when, why, its status). A burial a crash cut short is finished (True)."""
        with self.locked(), crashpoints.operation("bury"):
            if any(r["batch_id"] == batch_id for r in self._live_rows()):
                return False
            burial = self._burial(batch_id)
            if burial is None:
                try:
                    batch = self.get_batch(batch_id)
                except NotFoundError:
                    return False
                burial = self._start_burial(batch, keep or _bare(batch, reason))
            elif keep is not None:
                burial = {**burial, "tombstone": keep}
            self._finish_burial(batch_id, burial)
        return True

    def _burial(self, batch_id: str) -> dict[str, Any] | None:
        counts = self.index_data().get("counts", {}).get("1", {})
        found: dict[str, Any] | None = counts.get(BURYING, {}).get(batch_id)
        return found

    def _start_burial(self, batch: BatchRecord, tombstone: dict[str, Any]) -> dict[str, Any]:
        """One index write: the batch uncounted, and its burial noted."""
        burial = {"client_id": batch.client_id, "at": utcnow().isoformat(), "tombstone": tombstone}
        with self._index_change() as data:
            count_archived(data["counts"], batch, -1)
            data["counts"].setdefault("1", {}).setdefault(BURYING, {})[batch.batch_id] = burial
        return burial

    def _finish_burial(self, batch_id: str, burial: dict[str, Any]) -> None:
        """The listing rows' tombstones (readers take a repeated one once), the history's
        (once), an older state's two files gone, then the note."""
        tombstone = burial["tombstone"]
        self.archive_rows.bury(batch_id, burial["client_id"], burial["at"])
        if self.history.tombstone(batch_id) != tombstone:
            self.history.bury(batch_id, tombstone)
        for kind in ("batches", "tasks"):
            unlink_quietly(self.archive_dir / batch_id[:6] / kind / f"{batch_id}.json")
        with self._index_change() as data:
            data["counts"].get("1", {}).get(BURYING, {}).pop(batch_id, None)

    def erase_batch(self, batch: BatchRecord, tombstone: dict[str, Any]) -> None:
        """Replace an ended batch by `tombstone`: out of the index if it is still there (its
        row and ledger entries to the archive), buried with `tombstone` (`bury_batch`), its
        duplicate keys removed. The caller checked it ended and settled."""
        batch_id = batch.batch_id
        with self.locked():
            if self.index_names(batch_id):
                self.archive(batch)
            reason = str(tombstone.get("deleted_by", "deleted"))
            self.bury_batch(batch_id, reason=reason, keep=tombstone)
            for key in duplicate_keys(batch.sha256, batch.batch_ref):
                path = self.keys_dir / batch.client_id / key
                if _names(path, batch_id):  # a later batch's key stays
                    unlink_quietly(path)
            unlink_quietly(self.leases_dir / f"{batch_id}.lock")
        self.parsed_tasks.forget(batch_id)


def _bare(batch: BatchRecord, reason: str) -> dict[str, Any]:
    return {"at": utcnow().isoformat(), "reason": reason, "status": str(batch.status)}


def _names(path: Path, batch_id: str) -> bool:
    try:
        return path.read_text(encoding="utf-8").strip() == batch_id
    except FileNotFoundError:
        return False
