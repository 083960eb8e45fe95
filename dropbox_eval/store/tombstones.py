"""Erasing a batch: what a delete or the retention prune removes of it in the state folder,
and the tombstone that stays in its place in the history (history.py).

An ended batch still in the index first leaves it as an emitted batch does (`archive`:
its row and ledger entries go to the archive, the money untouched; its record and tasks
become one history entry). Then it is buried (`bury_batch`: its listing rows hidden, its
history entry replaced by a tombstone, no longer counted), the tombstone is given what a
deleted batch keeps (id, client, status, dates, task counts, charge), and its duplicate
keys go, so the same bytes dropped again make a new batch. Each step can be done again: a
delete cut short is finished by the next one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models import BatchRecord, is_valid_id
from .files import unlink_quietly
from .rows import duplicate_keys

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others


class Tombstones(_Base):
    """Erasing an ended batch for good, leaving its tombstone."""

    if TYPE_CHECKING:

        def archive(self, batch: BatchRecord) -> None:
            """Move a batch out of the index (archiving.py)."""

        def bury_batch(self, batch_id: str, *, reason: str) -> bool:
            """Replace an archived batch by a bare tombstone (archiving.py)."""

    def tombstone(self, batch_id: str) -> dict[str, Any] | None:
        """The tombstone of an erased batch; None when it was not erased."""
        if not is_valid_id(batch_id):
            return None
        return self.history.tombstone(batch_id)

    def erase_batch(self, batch: BatchRecord, tombstone: dict[str, Any]) -> None:
        """Replace an ended batch by `tombstone`: out of the index if it is still there (its
        row and ledger entries to the archive), buried (`bury_batch`), the tombstone
        written, its duplicate keys removed. The caller checked it ended and settled."""
        batch_id = batch.batch_id
        with self.locked():
            if self.index_names(batch_id):
                self.archive(batch)
            self.bury_batch(batch_id, reason=str(tombstone.get("deleted_by", "deleted")))
            if self.history.tombstone(batch_id) != tombstone:  # what a delete keeps, over
                self.history.bury(batch_id, tombstone)  # the bare one (its reason and time)
            for key in duplicate_keys(batch.sha256, batch.batch_ref):
                path = self.keys_dir / batch.client_id / key
                if _names(path, batch_id):  # a later batch's key stays
                    unlink_quietly(path)
            unlink_quietly(self.leases_dir / f"{batch_id}.lock")
        self.parsed_tasks.forget(batch_id)


def _names(path: Path, batch_id: str) -> bool:
    try:
        return path.read_text(encoding="utf-8").strip() == batch_id
    except FileNotFoundError:
        return False
