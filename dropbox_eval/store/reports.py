"""A finished batch's report, kept beside its record, not in it.

The close fixes the report (`update_batch(report=...)`, its canonical bytes) in
`reports/<batch_id>.json`, written before the record that says the batch ended: a crash
between the two leaves a running batch whose next close writes it again. Reading or
changing the record never parses the report (at 50,000 tasks, 10 MB). Archiving moves it
into the batch's history entry (history.py). Older versions kept the report inside the
record (live or archived): it is read there, as it was.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import StoreError
from ..models import is_valid_id
from ..util.canonicaljson import canonical
from ..util.fileio import write_atomically
from .files import read_table

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others


class Reports(_Base):
    """The fixed reports of ended batches."""

    def report_file(self, batch_id: str) -> Path:
        """Where a live batch's fixed report is."""
        return self.reports_dir / f"{batch_id}.json"

    def write_report(self, batch_id: str, report: bytes | Iterable[bytes]) -> None:
        """Fix a batch's report (before the record that ends it is written); given in
        pieces (protocol/report.py `ReportPieces`), it is written as they are made."""
        write_atomically(self.report_file(batch_id), report)

    def live_report(self, batch_id: str) -> bytes | None:
        """The report fixed for a live batch (None: none fixed)."""
        try:
            return self.report_file(batch_id).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self.report_file(batch_id)}: {exc}") from exc

    def get_report(self, batch_id: str) -> bytes | None:
        """The report fixed when the batch ended, as delivered; None when none was (the
        batch runs, is unknown, or ended before reports were fixed). Live first: archiving
        writes the history's copy before it removes the live one."""
        if not is_valid_id(batch_id):
            return None
        found = self.live_report(batch_id)
        if found is None:
            found = self.history.report(batch_id)
        if found is None:
            legacy = self._report_in_record(batch_id)
            found = None if legacy is None else canonical(legacy)
        return found

    def open_report(self, batch_id: str) -> BinaryIO | None:
        """The fixed report to read in blocks (the caller closes it): a live one's file,
        else `get_report`'s bytes (archived reports are read whole from their segment)."""
        if is_valid_id(batch_id):
            try:
                return self.report_file(batch_id).open("rb")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot read {self.report_file(batch_id)}: {exc}") from exc
        found = self.get_report(batch_id)
        return None if found is None else io.BytesIO(found)

    def _report_in_record(self, batch_id: str) -> dict[str, Any] | None:
        """The report an older version kept inside the batch's record (live or archived)."""
        path = self._batch_file(batch_id)
        rows = read_table(path, "batch") if path.exists() else []
        row = rows[0] if rows else self.history.record(batch_id)
        report = None if row is None else row.get("report")
        return report if isinstance(report, dict) else None
