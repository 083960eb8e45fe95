"""TinyDB behind a small repository API; the only module that imports tinydb.

Layout under the state folder::

    index.json                  clients, the live ledger, one summary row per live batch
    batches/<batch_id>.json     the batch record (one small row)
    tasks/<batch_id>.json       the batch's tasks (one row per task)
    keys/<client_id>/<key>      duplicate-drop keys (sha256 of the bytes, batch_ref) -> batch id
    archive/batches.jsonl       summary rows of emitted batches (append-only)
    archive/ledger.jsonl        ledger entries of emitted batches (append-only)
    store.lock                  inter-process lock held around every read-modify-write

Every TinyDB file is replaced atomically (temp file, fsync, rename, fsync of the folder), so a
crash or a concurrent reader never sees half a file. The cost of an operation never grows
with the history: a batch's writes cost its own size, the index holds only live batches
(an emitted batch's row and ledger entries move to the append-only archive in one step), and
duplicate lookups are one file name.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from tinydb import Query, TinyDB
from tinydb.storages import Storage

from .errors import NoState, NotFoundError, StoreError
from .fileio import write_atomically
from .models import BatchRecord, Client, LedgerEntry, TaskRecord, is_valid_id, utcnow

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

    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        """`read_only` creates nothing and cleans nothing (for commands that only look);
        it raises NoState when `state_dir` holds no state."""
        self.state_dir = state_dir
        self.read_only = read_only
        self.batches_dir = state_dir / "batches"
        self.tasks_dir = state_dir / "tasks"
        self.keys_dir = state_dir / "keys"
        self.archive_dir = state_dir / "archive"
        self.leases_dir = state_dir / "leases"
        self._lock = FileLock(str(state_dir / "store.lock"))
        if read_only:
            if not self.batches_dir.is_dir():
                raise NoState(f"no state folder at {state_dir}")
            return
        for folder in (
            self.batches_dir,
            self.tasks_dir,
            self.keys_dir,
            self.archive_dir,
            self.leases_dir,
        ):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file in the way, no permission
                raise StoreError(f"cannot create the state folder {folder}: {exc}") from None
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self) -> None:
        """Temp files and leases of archived batches left by a crash. Only old temp files:
        another process may be mid-write."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        with self.locked():
            for folder in (self.state_dir, self.batches_dir, self.tasks_dir):
                for tmp in folder.glob(".*.tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        if tmp.stat().st_mtime < cutoff:
                            tmp.unlink()
            live = {row["batch_id"] for row in self.list_batches(live_only=True)}
            for lease in self.leases_dir.glob("*.lock"):
                if lease.stem not in live:
                    self._drop_lease(lease.stem)

    @contextlib.contextmanager
    def intake_lease(self, batch_id: str, wait: float = 0.0) -> Iterator[bool]:
        """Exclusive right to create or close a batch's issues, across processes; yields
        False when another holder kept it for `wait` seconds."""
        lease = FileLock(str(self.leases_dir / f"{batch_id}.lock"))
        try:
            lease.acquire(timeout=wait)
        except Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lease.release()

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

    def _tasks_file(self, batch_id: str) -> Path:
        return self.tasks_dir / f"{batch_id}.json"

    # -- clients and ledger -------------------------------------------------------------

    def get_client(self, client_id: str) -> Client | None:
        """The client, or None when unknown."""
        with self._index() as db:  # search(), not get(cond): get reads the table twice
            rows = db.table("clients").search(Query().client_id == client_id)
        return Client.model_validate(rows[0]) if rows else None

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
        """Append a ledger entry and apply its amount and held change to the client."""
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
            if any(
                e.get("batch_id") == batch_id and e["kind"] == "release"
                for e in data["ledger"].values()
            ):
                return False
            for entry in entries:
                _post(data, entry)
        return True

    def ledger(self, client_id: str) -> list[LedgerEntry]:
        """The client's ledger (archived and live), oldest first."""
        with self._index() as db:
            rows = db.table("ledger").search(Query().client_id == client_id)
        entries = {
            r["entry_id"]: r for r in self._archived("ledger") if r["client_id"] == client_id
        }
        entries.update((r["entry_id"], r) for r in rows)
        return sorted((LedgerEntry.model_validate(r) for r in entries.values()), key=lambda e: e.at)

    # -- batches ------------------------------------------------------------------------

    def create_batch(
        self, batch: BatchRecord, tasks: list[TaskRecord], hold: LedgerEntry | None = None
    ) -> None:
        """Write the tasks (one write for all) and the batch record, then its index row and
        hold in one atomic write, then its duplicate keys.

        A crash before the index write leaves only unreferenced files, never a batch without
        its hold; until the keys exist, duplicates are found in the (live) index rows.
        """
        with self.locked():
            _write_table(self._tasks_file(batch.batch_id), "tasks", [_dump(t) for t in tasks])
            _write_table(self._batch_file(batch.batch_id), "batch", [_dump(batch)])
            with self._index_change() as data:
                _insert(data["batches"], _summary(batch))
                if hold is not None:
                    _post(data, hold)
            self._write_keys(batch)

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch record; NotFoundError when unknown."""
        path = self._batch_file(batch_id)
        if not is_valid_id(batch_id) or not path.exists():
            raise NotFoundError(f"no batch {batch_id!r}")
        with self._open(path) as db:
            row = db.table("batch").get(doc_id=1)
        if row is None:
            raise StoreError(f"{path} has no batch row")
        return BatchRecord.model_validate(row)

    def get_tasks(self, batch_id: str) -> list[TaskRecord]:
        """Every task of the batch in file order."""
        path = self._tasks_file(batch_id)
        if not is_valid_id(batch_id) or not path.exists():
            raise NotFoundError(f"no batch {batch_id!r}")
        with self._open(path) as db:
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

        with self.locked(), self._open(self._tasks_file(batch_id)) as db:
            db.table("tasks").update(apply)

    def update_batch(self, batch_id: str, **fields: Any) -> BatchRecord:
        """Change batch fields (one small write) and refresh its index row; an emitted
        batch's row and ledger entries move to the archive. Returns the new record."""
        encoded = {k: _encode(v) for k, v in fields.items()}
        with self.locked():
            with self._open(self._batch_file(batch_id)) as db:
                db.table("batch").update(encoded, doc_ids=[1])
                row = db.table("batch").get(doc_id=1)
            batch = BatchRecord.model_validate(row)
            if batch.emitted_at is not None:
                self.archive(batch)
            elif any(key in _SUMMARY_FIELDS for key in fields):
                with self._index_change() as data:
                    for index_row in data["batches"].values():
                        if index_row["batch_id"] == batch_id:
                            index_row.update(_summary(batch))
        return batch

    def archive(self, batch: BatchRecord) -> None:
        """Move an emitted batch out of the index: append to the archive first, then drop
        its row and ledger entries in one write (idempotent; readers dedupe)."""
        with self._index_change() as data:
            if not any(r["batch_id"] == batch.batch_id for r in data["batches"].values()):
                return  # archived already (a re-emit)
            entries = {
                k: e for k, e in data["ledger"].items() if e.get("batch_id") == batch.batch_id
            }
            _append_lines(self.archive_dir / "ledger.jsonl", list(entries.values()))
            _append_lines(self.archive_dir / "batches.jsonl", [_summary(batch)])
            data["batches"] = {
                k: r for k, r in data["batches"].items() if r["batch_id"] != batch.batch_id
            }
            data["ledger"] = {k: e for k, e in data["ledger"].items() if k not in entries}
        self._drop_lease(batch.batch_id)

    def _drop_lease(self, batch_id: str) -> None:
        """An emitted batch's issues are never created or closed again: its lease file goes
        (the leases folder holds only live batches)."""
        with contextlib.suppress(FileNotFoundError):
            (self.leases_dir / f"{batch_id}.lock").unlink()

    def _archived(self, kind: str) -> list[dict[str, Any]]:
        path = self.archive_dir / f"{kind}.jsonl"
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        rows = []
        for line in lines:
            with contextlib.suppress(ValueError):  # a line cut short by a crash mid-append
                rows.append(json.loads(line))
        return rows

    def list_batches(
        self, where: Callable[[dict[str, Any]], bool] | None = None, *, live_only: bool = False
    ) -> list[dict[str, Any]]:
        """Summary rows (batch_id, client_id, status, done, total, ...), oldest first.

        `live_only` reads only the index (batches not yet emitted): its cost does not grow
        with the history, which the archive does.
        """
        with self._index() as db:
            rows = {r["batch_id"]: dict(r) for r in db.table("batches").all()}
        if not live_only:
            for row in self._archived("batches"):
                rows.setdefault(row["batch_id"], row)
        chosen = [r for r in rows.values() if where is None or where(r)]
        return sorted(chosen, key=lambda r: str(r["batch_id"]))

    def find_batch(
        self, client_id: str, *, sha256: str | None = None, batch_ref: str | None = None
    ) -> str | None:
        """The id of an earlier batch of this client with the same bytes or batch_ref."""
        for key in _keys(sha256, batch_ref):
            path = self.keys_dir / client_id / key
            with contextlib.suppress(FileNotFoundError):
                return path.read_text(encoding="utf-8").strip()

        def same(row: dict[str, Any]) -> bool:
            return row["client_id"] == client_id and bool(
                (sha256 and row.get("sha256") == sha256)
                or (batch_ref and row.get("batch_ref") == batch_ref)
            )

        found = self.list_batches(same, live_only=True)  # a crash before the keys were written
        return str(found[0]["batch_id"]) if found else None

    def _write_keys(self, batch: BatchRecord) -> None:
        for key in _keys(batch.sha256, batch.batch_ref):
            write_atomically(self.keys_dir / batch.client_id / key, batch.batch_id)


_SUMMARY_FIELDS = (
    "batch_id",
    "client_id",
    "batch_ref",
    "status",
    "total",
    "done",
    "repo",
    "sha256",
    "source",
    "created_at",
    "completed_at",
    "emitted_at",
)


def _summary(batch: BatchRecord) -> dict[str, Any]:
    data = _dump(batch)
    return {key: data[key] for key in _SUMMARY_FIELDS}


def _keys(sha256: str | None, batch_ref: str | None) -> list[str]:
    return ([f"sha256-{sha256}"] if sha256 else []) + ([f"ref-{batch_ref}"] if batch_ref else [])


def _write_table(path: Path, table: str, docs: list[dict[str, Any]]) -> None:
    """A whole TinyDB file of one table in one atomic write."""
    AtomicJSONStorage(str(path)).write({table: {str(i): d for i, d in enumerate(docs, 1)}})


def _append_lines(path: Path, docs: list[dict[str, Any]]) -> None:
    if not docs:
        return
    with path.open("a+", encoding="utf-8") as handle:
        if handle.tell() > 0:
            handle.seek(handle.tell() - 1)
            if handle.read(1) != "\n":  # finish a line a crash cut short
                handle.write("\n")
        handle.write("".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs))
        handle.flush()
        os.fsync(handle.fileno())


def _insert(table: dict[str, Any], doc: dict[str, Any]) -> None:
    next_id = max((int(key) for key in table), default=0) + 1
    table[str(next_id)] = doc


def _post(data: dict[str, dict[str, Any]], entry: LedgerEntry) -> None:
    """Apply the entry's changes to the client as it is in `data` (read under the lock) and
    record the resulting balance and held amount, and the posting time, in the entry."""
    for client in data["clients"].values():
        if client["client_id"] == entry.client_id:
            client["balance"] += entry.amount
            client["held"] = client.get("held", 0) + entry.held_change
            _insert(
                data["ledger"],
                {
                    **_dump(entry),
                    "balance_after": client["balance"],
                    "held_after": client["held"],
                    "at": utcnow().isoformat(),
                },
            )
            return
    raise StoreError(f"ledger entry for unknown client {entry.client_id!r}")


def _encode(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
