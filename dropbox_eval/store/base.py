"""StoreBase: the state folder, its locks and the index (one atomic write per change)."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinydb import TinyDB

from ..errors import NoState, StoreError, storage_error, storage_errors
from ..util.locks import FileClaim, SharedLock
from .archive import Archive
from .files import AtomicJSONStorage, ParsedFile, unlink_quietly
from .history import History
from .rows import Row
from .secrecy import private_folder
from .taskcache import ParsedTasks
from .tasks import TaskFiles

STALE_TEMP_SECONDS = 300
RECORD_STRIPES = 64  # locks over the batches' own files: a batch's is the crc32 of its id


class StoreBase:
    """Folders, the inter-process lock, per-batch leases and the index."""

    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        """`read_only` creates nothing and cleans nothing (for commands that only look);
        it raises NoState when `state_dir` holds no state."""
        self.state_dir = state_dir
        self.read_only = read_only
        self.batches_dir = state_dir / "batches"
        self.keys_dir = state_dir / "keys"
        self.archive_dir = state_dir / "archive"
        self.leases_dir = state_dir / "leases"
        self.reports_dir = state_dir / "reports"  # ended batches' reports (reports.py)
        self.tasks = TaskFiles(state_dir / "tasks", self.archive_dir)
        self.archive_rows = Archive(self.archive_dir)
        self.history = History(self.archive_dir)
        self._lock = SharedLock(state_dir / "store.lock")
        self._parsed_index = ParsedFile()  # index.json, parsed again only when it changed
        self._view = threading.local()  # the index as a group commit changes it (`group_view`)
        self.fresh_ids: set[str] = set()  # fresh copies this process wrote, not sealed yet
        self.sealed_ids: set[str] = set()  # fresh copies the next index write leaves out
        self.record_locks_dir = state_dir / "record-locks"
        self._record_locks = [
            SharedLock(self.record_locks_dir / f"{n:02d}.lock") for n in range(RECORD_STRIPES)
        ]
        self.parsed_tasks = ParsedTasks(self.tasks)
        self.tasks.compactor = self.parsed_tasks.compact  # from the parsed tasks, if kept
        if read_only:
            if not self.batches_dir.is_dir():
                raise NoState(f"no state folder at {state_dir}")
            return
        for folder in (
            self.state_dir,  # 0700 first (secrecy.py): index.json holds client secrets
            self.batches_dir,
            self.tasks.live,
            self.keys_dir,
            self.archive_dir,
            self.leases_dir,
            self.record_locks_dir,
        ):
            try:
                private_folder(folder)
            except OSError as exc:  # a file in the way, no permission, a read-only disk
                error = storage_error(exc, folder, what="cannot create the state folder")
                raise error or StoreError(
                    f"cannot create the state folder {folder}: {exc}"
                ) from None
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Temp files and leases a crash left in the live folders (bounded by live work).
        Only old temp files: another process may be mid-write."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        with self.locked():
            for folder in (self.state_dir, self.batches_dir, self.tasks.live, self.reports_dir):
                for tmp in folder.glob(".*.tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        if tmp.stat().st_mtime < cutoff:
                            tmp.unlink()
            live = {row["batch_id"] for row in self._live_rows()}
            for lease in self.leases_dir.glob("*.lock"):
                if lease.stem in live:
                    continue
                with self.claim_issues(lease.stem) as free:
                    if free:  # else an intake is staging that batch now
                        unlink_quietly(lease)
            self.restore_fresh()

    def restore_fresh(self) -> None:
        """Write back what a power loss took of fresh batches (groupcommit.py)."""

    @contextlib.contextmanager
    def claim_issues(self, batch_id: str, wait: float = 0.0) -> Iterator[bool]:
        """Exclusive right to create or close a batch's issues, across processes; yields
        False when another holder kept it for `wait` seconds."""
        lease = FileClaim(self.leases_dir / f"{batch_id}.lock")
        with storage_errors(lease.path):
            taken = lease.take(wait)
        if not taken:
            yield False
            return
        try:
            yield True
        finally:
            lease.release()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the inter-process lock (re-entrant within a thread)."""
        with _taken(self._lock):
            yield

    @contextlib.contextmanager
    def record_locked(self, batch_id: str) -> Iterator[None]:
        """Hold the lock over one batch's own files (its record and its tasks), across
        processes. A change to them alone (a flag on the record, a task's issue) needs no
        more, so drops of different batches do not queue on the store lock. Order: the
        store lock first, when both are taken; never the store lock while holding this."""
        with _taken(self._record_locks[zlib.crc32(batch_id.encode()) % RECORD_STRIPES]):
            yield

    @contextlib.contextmanager
    def _open(self, path: Path) -> Iterator[TinyDB]:
        db = TinyDB(str(path), storage=AtomicJSONStorage)
        try:
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _index(self) -> Iterator[TinyDB]:
        db = TinyDB(str(self.state_dir / "index.json"), storage=_IndexStorage, store=self)
        try:
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _index_change(self) -> Iterator[dict[str, dict[str, Any]]]:
        """Read-modify-write the whole index in ONE atomic write, under the lock.

        Changes that belong together (a batch row, its ledger entry and the new balance)
        then land together or not at all, whatever instant the process dies.
        """
        with self.locked():
            data = self.writable_index()
            yield data
            self.write_index(data)

    def index_data(self) -> dict[str, dict[str, Any]]:
        """The index as it is (or as the group commit under way in this thread changed it);
        shared: not to be edited (`index_copy`)."""
        return _IndexStorage(str(self.state_dir / "index.json"), self).read() or {}

    def writable_index(self) -> dict[str, dict[str, Any]]:
        """A copy of the index that a change may edit (`index_copy`)."""
        return index_copy(self.index_data())

    def cached_index(self) -> dict[str, dict[str, Any]] | None:
        """The index as this process last read or wrote it, without looking at the file."""
        return self._parsed_index.cached()

    def write_index(self, data: dict[str, dict[str, Any]]) -> None:
        """Replace the index with `data` in one atomic write; the caller holds the lock.
        Fresh copies that were sealed since, or whose batch left the index, are left out."""
        sealed = set(self.sealed_ids)
        fresh = data.pop("fresh", None)
        if fresh:
            live = {row["batch_id"] for row in data["batches"].values()}
            kept = {k: v for k, v in fresh.items() if k in live and k not in sealed}
            if kept:
                data["fresh"] = kept
        _IndexStorage(str(self.state_dir / "index.json"), self).write(data)
        self.sealed_ids -= sealed

    @contextlib.contextmanager
    def group_view(self, data: dict[str, dict[str, Any]]) -> Iterator[None]:
        """Reads of the index in this thread see `data` (a group commit's changes so far)."""
        self._view.data = data
        try:
            yield
        finally:
            self._view.data = None

    def _batch_file(self, batch_id: str) -> Path:
        live = self.batches_dir / f"{batch_id}.json"
        if live.exists():
            return live
        archived = self.archive_dir / batch_id[:6] / "batches" / f"{batch_id}.json"
        return archived if archived.exists() else live

    def stored_batch_ids(self) -> list[str]:
        """The ids of the batch records in the live folder, the index naming them or not
        (bounded by live work)."""
        return sorted(path.stem for path in self.batches_dir.glob("*.json"))

    def being_recorded(self, batch_id: str) -> bool:
        """Whether an intake, in this process or another, holds the batch's lease before
        its commit (its files exist, its index row not yet: `TinyDBStore.staged`)."""
        if not (self.leases_dir / f"{batch_id}.lock").exists():
            return False  # staging creates it first
        if self.index_names(batch_id):
            return False
        with self.claim_issues(batch_id) as free:
            return not free

    def drop_unrecorded(self, batch_id: str) -> bool:
        """Remove a live record, its tasks and its lease when the index never named the
        batch and no intake is staging it: an intake killed before its one committing write
        (the index row and hold). False, and nothing removed, otherwise."""
        with self.locked(), self.claim_issues(batch_id) as free:
            if not free or self.index_names(batch_id):
                return False
            self._remove_batch_files(batch_id)
        return True

    def _remove_batch_files(self, batch_id: str) -> None:
        """An uncommitted batch's files: its tasks, its record and its lease file."""
        with self.record_locked(batch_id):
            base = self.tasks.live / f"{batch_id}.json"
            for path in (
                self.tasks.journal(base),
                base,
                self.leases_dir / f"{batch_id}.lock",
                self.batches_dir / f"{batch_id}.json",
            ):
                unlink_quietly(path)
        self.parsed_tasks.forget(batch_id)

    def is_recorded(self, batch_id: str) -> bool:
        """Whether the batch's intake committed: the index names it, or it is archived (a
        record whose index row was never written is not a batch yet)."""
        if self.index_names(batch_id):
            return True
        if self._batch_file(batch_id) != self.batches_dir / f"{batch_id}.json":
            return True  # archived by an older version, as two files
        return self.history.holds(batch_id)

    def index_names(self, batch_id: str) -> bool:
        """Whether the index has a row for the batch (its intake committed, it is live)."""
        rows = self.index_data().get("batches", {}).values()
        return any(row["batch_id"] == batch_id for row in rows)

    def _live_rows(self) -> list[Row]:
        """The index's live batch rows (a cache of their records' summary fields), in
        order. Shared with every reader of the parsed index: read them, never edit them (a
        change replaces a row, `index_copy`)."""
        return list(self.index_data().get("batches", {}).values())


@contextlib.contextmanager
def _taken(lock: SharedLock) -> Iterator[None]:
    """Hold `lock`; a lock file that cannot be created (a full or read-only state folder)
    is a StorageUnavailable naming it, while errors of the block go through as they are."""
    with contextlib.ExitStack() as held:
        with storage_errors(lock.path):
            held.enter_context(lock)
        yield


BIG_TABLES = ("ledger", "batches", "fresh")


def index_copy(data: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A copy of the index that a change may edit: the parsed index is shared by readers.
    The big tables are copied one level deep (a change adds, removes or replaces their rows,
    never edits one in place); a client's row is copied by itself, as its changes set its
    fields (deep copies of every client's row were a tenth of a drop's store CPU); the small
    tables whole."""
    small = {k: v for k, v in data.items() if k not in BIG_TABLES and k != "clients"}
    copied = copy.deepcopy(small)
    copied["clients"] = {key: dict(row) for key, row in data.get("clients", {}).items()}
    for name in BIG_TABLES:
        if name in data or name != "fresh":
            copied[name] = dict(data.get(name, {}))
    copied.setdefault("counts", {})
    return copied


class _IndexStorage(AtomicJSONStorage):
    """The index file, not parsed again while its bytes are those this process last
    parsed or wrote (`ParsedFile`)."""

    def __init__(self, path: str, store: StoreBase) -> None:
        super().__init__(path)
        self._store = store
        self._parsed = store._parsed_index

    def read(self) -> dict[str, dict[str, Any]] | None:
        view: dict[str, dict[str, Any]] | None = getattr(self._store._view, "data", None)
        return view if view is not None else self._parsed.read(self._path)

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        self._parsed.write(self._path, data)
