"""`reports/` in a client's SFTP view: its own reports, read-only, straight from the outbox.

On disk a report stays where the file protocol puts it, `outbox/<batch_id>.json` (with
`<batch_id>.jsonl` beside it for a batch that came as JSON Lines, and
`outbox/undelivered/<batch_id>.json` while its callback is failing); every client's
reports share those folders. The view shows one client exactly its own: `reports/` lists
the client's batches (from the state folder, read-only) whose report is in the outbox, and
`reports/undelivered/` those kept there. A batch id the client does not own does not exist
in its view, whatever path names it. The listing costs the client's own batches, never the
other clients' reports.

The state is read on one thread of the view's own, never on the event loop (a client with
thousands of batches would hold every other session up) and never from two threads at once;
listing.py states and sends the listing a page at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from asyncssh import SFTPFailure, SFTPNoSuchFile

from ..errors import DropboxEvalError, NoState, NotFoundError
from ..models import is_valid_id
from ..store import Store
from ..store.statefolder import open_store
from ..util.names import REPORTS_DIR, UNDELIVERED_DIR
from .paths import DIR_FLAGS, stat_at

log = logging.getLogger("dropbox_eval")

UNDELIVERED = f"{REPORTS_DIR}/{UNDELIVERED_DIR}"
FOLDERS = (REPORTS_DIR, UNDELIVERED)
"""The view's folders, as `paths.Target.folder` names them."""
REPORT_SUFFIXES = (".json", ".jsonl")  # the report, and its JSON Lines twin where written
Result = TypeVar("Result")


class Owners:
    """Whose batch is whose, read from the state folder without writing to it.

    The boundary for the store's errors: a state that cannot be read is an SFTP failure
    the client can retry (and a warning for the operator).
    """

    def __init__(self, state_dir: Path, database_url: str | None = None) -> None:
        """The store is opened on first use (the service may not have created it yet), on
        the one thread that reads it; on PostgreSQL when `database_url` is set."""
        self.state_dir = state_dir
        self.database_url = database_url
        self._store: Store | None = None
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sftp-state")

    async def read(self, question: Callable[[], Result]) -> Result:
        """Run `question` (batch_ids, owns) on the state's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._reader, question)

    def close(self) -> None:
        """Stop the state's thread (reads not yet started are dropped) and close the store."""
        self._reader.shutdown(wait=False, cancel_futures=True)
        if self._store is not None:
            self._store.close()

    def _opened(self) -> Store | None:
        if self._store is None:
            try:
                self._store = open_store(
                    self.state_dir, read_only=True, database_url=self.database_url
                )
            except NoState:
                return None
        return self._store

    def batch_ids(self, client_id: str) -> list[str]:
        """Every batch of the client, live and archived, newest first (on the state's
        thread: `read`)."""
        store = self._opened()
        if store is None:
            return []
        try:
            rows = store.page_batches(client_id=client_id, limit=sys.maxsize)
        except DropboxEvalError as exc:
            raise _unreadable(client_id, exc) from None
        return [row.batch_id for row in rows]

    def owns(self, client_id: str, batch_id: str) -> bool:
        """Whether `batch_id` names a batch of `client_id` (on the state's thread: `read`)."""
        store = self._opened()
        if store is None or not is_valid_id(batch_id):
            return False
        try:
            return store.get_batch(batch_id).client_id == client_id
        except NotFoundError:
            return False
        except DropboxEvalError as exc:
            raise _unreadable(client_id, exc) from None


def _unreadable(client_id: str, error: DropboxEvalError) -> SFTPFailure:
    log.warning("sftp: client=%s: cannot read the state for reports/: %s", client_id, error)
    return SFTPFailure("reports cannot be read right now; try again later")


class ReportsView:
    """One client's `reports/` and `reports/undelivered/`."""

    def __init__(self, outbox: Path, client_id: str, owners: Owners) -> None:
        """`outbox` is the service's output folder."""
        self.outbox = outbox
        self.client_id = client_id
        self.owners = owners

    def folder_fd(self, folder: str) -> int:
        """A new descriptor of the outbox folder behind `folder` (the caller closes it)."""
        try:  # the operator's outbox may be a link; nothing below it is followed
            outbox = os.open(self.outbox, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise SFTPNoSuchFile(f"{folder}/ is empty: no report yet") from None
        if folder == REPORTS_DIR:
            return outbox
        try:
            return os.open(UNDELIVERED_DIR, DIR_FLAGS, dir_fd=outbox)
        except OSError:
            raise SFTPNoSuchFile(f"{folder}/ is empty: no undelivered report") from None
        finally:
            os.close(outbox)

    async def names(self) -> list[str]:
        """The file names the client's reports may have, newest batch first (whether each
        is in a folder is for the listing to find)."""
        batch_ids = await self.owners.read(lambda: self.owners.batch_ids(self.client_id))
        return [f"{batch_id}{suffix}" for batch_id in batch_ids for suffix in REPORT_SUFFIXES]

    async def find(self, folder_fd: int, name: str) -> os.stat_result | None:
        """The attributes of the client's own report `name` in an open view folder."""
        if not await self._owned(name):
            return None
        info = stat_at(folder_fd, name)
        return info if info is not None and stat.S_ISREG(info.st_mode) else None

    async def _owned(self, name: str) -> bool:
        suffix = next((s for s in REPORT_SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            return False
        batch_id = name.removesuffix(suffix)
        return await self.owners.read(lambda: self.owners.owns(self.client_id, batch_id))
