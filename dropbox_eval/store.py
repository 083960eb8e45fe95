"""TinyDB behind a small repository API; the only module that imports tinydb.

Layout under the state folder::

    index.json              tables clients, ledger, batches (one small summary row per batch)
    batches/<batch_id>.json tables batch (one row) and tasks (one row per task)
    store.lock              inter-process lock held around every read-modify-write

Every TinyDB file is replaced atomically (temp file, fsync, rename, fsync of the folder), so a
crash or a concurrent reader never sees half a file. A write to one batch costs only that
batch's size, never the size of the history.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from filelock import FileLock
from tinydb import Query, TinyDB
from tinydb.storages import Storage

from .errors import NotFoundError, StoreError
from .fileio import write_atomically
from .models import BatchRecord, Client, LedgerEntry, TaskRecord

STALE_TEMP_SECONDS = 300


class AtomicJSONStorage(Storage):
    """TinyDB storage that re-reads per call and replaces the file atomically on write."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)

    def read(self) -> dict[str, dict[str, Any]] | None:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self._path}: {exc}") from exc
        try:
            data: dict[str, dict[str, Any]] = json.loads(text)
        except json.JSONDecodeError as exc:
            # Never fall back to "empty": the next write would wipe the database.
            raise StoreError(f"{self._path} is corrupt ({exc}); restore it from a copy") from exc
        return data

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        write_atomically(self._path, json.dumps(data, separators=(",", ":")))

    def close(self) -> None:
        """Nothing is held open between calls."""


def _dump(model: Any) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json")
    return data


class Store:
    """Repository API over the state folder; safe across threads and processes."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.batches_dir = state_dir / "batches"
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(state_dir / "store.lock"))
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self) -> None:
        """Temp files left by a crash. Only old ones: another process may be mid-write."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        with self.locked():
            for folder in (self.state_dir, self.batches_dir):
                for tmp in folder.glob(".*.tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        if tmp.stat().st_mtime < cutoff:
                            tmp.unlink()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the inter-process lock (re-entrant within a thread)."""
        with self._lock:
            yield

    @contextlib.contextmanager
    def _open(self, path: Path) -> Iterator[TinyDB]:
        db = TinyDB(str(path), storage=AtomicJSONStorage)
        try:
            yield db
        finally:
            db.close()

    def _index(self) -> contextlib.AbstractContextManager[TinyDB]:
        return self._open(self.state_dir / "index.json")

    @contextlib.contextmanager
    def _index_change(self) -> Iterator[dict[str, dict[str, Any]]]:
        """Read-modify-write the whole index in ONE atomic write, under the lock.

        Changes that belong together (a batch row, its ledger entry and the new balance)
        then land together or not at all, whatever instant the process dies.
        """
        storage = AtomicJSONStorage(str(self.state_dir / "index.json"))
        with self.locked():
            data = storage.read() or {}
            for table in ("clients", "ledger", "batches"):
                data.setdefault(table, {})
            yield data
            storage.write(data)

    def _batch_file(self, batch_id: str) -> Path:
        return self.batches_dir / f"{batch_id}.json"

    # -- clients and ledger -------------------------------------------------------------

    def get_client(self, client_id: str) -> Client | None:
        """The client, or None when unknown."""
        with self._index() as db:
            row = db.table("clients").get(Query().client_id == client_id)
        return Client.model_validate(row) if row else None

    def list_clients(self) -> list[Client]:
        """Every client, sorted by id."""
        with self._index() as db:
            rows = db.table("clients").all()
        return sorted((Client.model_validate(r) for r in rows), key=lambda c: c.client_id)

    def add_client(self, client: Client) -> None:
        """Create a client; the caller holds the lock and checked it is new."""
        with self._index_change() as data:
            _insert(data["clients"], _dump(client))

    def post_ledger(self, entry: LedgerEntry) -> None:
        """Append a ledger entry and set the client's balance to its `balance_after`."""
        with self._index_change() as data:
            _post(data, entry)

    def update_client(self, client_id: str, **fields: Any) -> None:
        """Change client fields other than money (secrets, API key hashes)."""
        with self._index_change() as data:
            for client in data["clients"].values():
                if client["client_id"] == client_id:
                    client.update(fields)

    def settle(self, entries: list[LedgerEntry]) -> bool:
        """Post a batch's settlement entries once; False if that batch was already settled."""
        if not entries:
            return False
        batch_id = entries[0].batch_id
        with self._index_change() as data:
            if any(e.get("batch_id") == batch_id and e["kind"] == "release"
                   for e in data["ledger"].values()):
                return False
            for entry in entries:
                _post(data, entry)
        return True

    def ledger(self, client_id: str) -> list[LedgerEntry]:
        """The client's ledger, oldest first."""
        with self._index() as db:
            rows = db.table("ledger").search(Query().client_id == client_id)
        return [LedgerEntry.model_validate(r) for r in rows]

    # -- batches ------------------------------------------------------------------------

    def create_batch(self, batch: BatchRecord, tasks: list[TaskRecord],
                     charge: LedgerEntry | None = None) -> None:
        """Write a new batch file (one write for all tasks), then its index row and charge.

        The index row and the charge are one atomic write: a crash before it leaves only an
        unreferenced batch file, never an uncharged or half-recorded batch.
        """
        path = self._batch_file(batch.batch_id)
        if path.exists():
            raise StoreError(f"batch {batch.batch_id} already exists")
        with self._open(path) as db:
            db.storage.write(
                {
                    "batch": {"1": _dump(batch)},
                    "tasks": {str(i): _dump(t) for i, t in enumerate(tasks, start=1)},
                }
            )
        with self._index_change() as data:
            _insert(data["batches"], _summary(batch))
            if charge is not None:
                _post(data, charge)

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record; NotFoundError when unknown."""
        path = self._batch_file(batch_id)
        if not _safe_id(batch_id) or not path.exists():
            raise NotFoundError(f"no batch {batch_id!r}")
        with self._open(path) as db:
            row = db.table("batch").get(doc_id=1)
        if row is None:
            raise StoreError(f"{path} has no batch row")
        return BatchRecord.model_validate(row)

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """Every task of the batch in file order."""
        self.get_batch(batch_id)
        with self._open(self._batch_file(batch_id)) as db:
            rows = db.table("tasks").all()
        return [TaskRecord.model_validate(r) for r in rows]

    def update_tasks(self, batch_id: str, changes: dict[str, dict[str, Any]]) -> None:
        """Apply per-task field changes keyed by task_id in one write."""
        if not changes:
            return
        encoded = {
            task_id: {k: _encode(v) for k, v in fields.items()}
            for task_id, fields in changes.items()
        }

        def apply(doc: MutableMapping[str, Any]) -> None:
            doc.update(encoded.get(doc["task_id"], {}))

        with self.locked(), self._open(self._batch_file(batch_id)) as db:
            db.table("tasks").update(apply)

    def update_batch(self, batch_id: str, **fields: Any) -> BatchRecord:
        """Change batch fields (one write) and refresh its index row; returns the new record."""
        encoded = {k: _encode(v) for k, v in fields.items()}
        with self.locked(), self._open(self._batch_file(batch_id)) as db:
            db.table("batch").update(encoded, doc_ids=[1])
            row = db.table("batch").get(doc_id=1)
        batch = BatchRecord.model_validate(row)
        summary = _summary(batch)
        if any(key in summary for key in fields):
            with self._index_change() as data:
                for row in data["batches"].values():
                    if row["batch_id"] == batch_id:
                        row.update(summary)
        return batch

    def list_batches(self, where: Callable[[dict[str, Any]], bool] | None = None) -> list[
        dict[str, Any]
    ]:
        """Index rows (batch_id, client_id, status, done, total, ...), oldest first."""
        with self._index() as db:
            rows = db.table("batches").all()
        chosen = [dict(r) for r in rows if where is None or where(r)]
        return sorted(chosen, key=lambda r: str(r["batch_id"]))

    def find_batch(self, client_id: str, *, sha256: str | None = None,
                   batch_ref: str | None = None) -> str | None:
        """The id of an earlier batch of this client with the same bytes or batch_ref."""

        def same(row: dict[str, Any]) -> bool:
            if row["client_id"] != client_id:
                return False
            return bool((sha256 and row.get("sha256") == sha256)
                        or (batch_ref and row.get("batch_ref") == batch_ref))

        found = self.list_batches(same)
        return str(found[0]["batch_id"]) if found else None


_SUMMARY_FIELDS = (
    "batch_id", "client_id", "batch_ref", "status", "total", "done", "repo", "sha256",
    "source", "created_at", "completed_at", "emitted_at",
)


def _summary(batch: BatchRecord) -> dict[str, Any]:
    data = _dump(batch)
    return {key: data[key] for key in _SUMMARY_FIELDS}


def _insert(table: dict[str, Any], doc: dict[str, Any]) -> None:
    next_id = max((int(key) for key in table), default=0) + 1
    table[str(next_id)] = doc


def _post(data: dict[str, dict[str, Any]], entry: LedgerEntry) -> None:
    _insert(data["ledger"], _dump(entry))
    for client in data["clients"].values():
        if client["client_id"] == entry.client_id:
            client["balance"] = entry.balance_after
            client["held"] = entry.held_after


def _encode(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _safe_id(batch_id: str) -> bool:
    return bool(batch_id) and "/" not in batch_id and "\\" not in batch_id and ".." not in batch_id
