"""Group commit of new batches: every intake waiting at the store lock goes in with the
one that holds it, in one index write (one fsync pair) for the whole group.

Each intake queues its batch and a `decide` step (its duplicate and funds checks, made
under the lock on the index as the group has changed it so far: `StoreBase.group_view`),
then takes the store lock. The first to get it commits every batch queued by then; the
others find theirs done when their turn comes and return at once.

A small batch's record and tasks are written without an fsync (a kill keeps them; a power
loss may not), because the same group write puts a copy of them in the index (`fresh`):
the index alone makes the batch durable. A restart writes back a file the copy outlives
(`restore_fresh`). The copy goes once the files are synced (`sealing`), which the first
durable write of the batch's record does, before any forge write and before the batch can
end. A big batch's files are written and synced beforehand, beside other intakes' (`staged`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..models import BatchRecord, LedgerEntry, TaskRecord
from ..util.fileio import fsync_file
from .files import read_table, write_table
from .rows import Row, dump
from .tasks import TABLE

if TYPE_CHECKING:
    from .base import StoreBase as _Base
else:
    _Base = object  # a mixin of TinyDBStore (engine.py), beside the others

FRESH = "fresh"  # the index's table of small new batches' record and tasks, until sealed
FRESH_MAX_TASKS = 64  # a bigger batch's files are synced before its commit
GROUP_WAIT = 0.002  # seconds a group's leader waits for intakes on their way to it

Decide = Callable[[], LedgerEntry | None]
Ready = Callable[..., None]  # staged: commit(hold, into=the index being changed)


@dataclass
class _Waiting:
    """One new batch in the queue: what to commit, and how it went."""

    batch: BatchRecord
    tasks: list[TaskRecord]
    decide: Decide
    ready: Ready | None  # a staged big batch's commit
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    done: bool = False
    error: BaseException | None = None


class _Line:
    """The new batches waiting for the next group, and the intakes on their way to it."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.waiting: list[_Waiting] = []
        self.arriving = 0  # intakes inside `arriving()`: queued, or still preparing

    def gather(self) -> list[_Waiting]:
        """The group: every batch queued once the intakes on their way have queued (or
        GROUP_WAIT has passed: a lone intake does not wait)."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.waiting) >= self.arriving, GROUP_WAIT)
            group, self.waiting = self.waiting, []
        return group


class GroupCommit(_Base):
    """`commit_new`: new batches committed in groups; their fresh copies kept and sealed."""

    _line_lock = threading.Lock()

    if TYPE_CHECKING:

        def staged(
            self, batch: BatchRecord, tasks: list[TaskRecord], *, wait: float = -1
        ) -> contextlib.AbstractContextManager[Ready]:
            """A big batch's files written and synced beforehand (engine.py)."""

        def _remove_unnamed(self, batch_id: str) -> None:
            """An uncommitted batch's files removed (engine.py)."""

        def index_new(
            self, data: dict[str, Any], batch: BatchRecord, hold: LedgerEntry | None
        ) -> None:
            """A new batch's row and hold put in the index `data` (engine.py)."""

    def commit_new(self, batch: BatchRecord, tasks: list[TaskRecord], decide: Decide) -> None:
        """Record a new batch, its tasks and the hold `decide` returns, with whatever other
        intakes wait at the store lock, durably. `decide` runs under that lock (in this
        thread's context, maybe on another thread) and raises to refuse: nothing is then
        recorded and this raises the same."""
        if len(tasks) <= FRESH_MAX_TASKS:
            self._queued(_Waiting(batch, tasks, decide, None))
            return
        with self.staged(batch, tasks) as ready:
            self._queued(_Waiting(batch, tasks, decide, ready))

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Around an intake's preparation and its `commit_new`: a group's leader waits a
        moment for the intakes on their way, so that more go in with one write."""
        line = self._line()
        with line.changed:
            line.arriving += 1
        try:
            yield
        finally:
            with line.changed:
                line.arriving -= 1
                line.changed.notify_all()

    def _queued(self, waiting: _Waiting) -> None:
        line = self._line()
        with line.changed:
            line.waiting.append(waiting)
            line.changed.notify_all()
        with self.locked():
            if not waiting.done:  # nobody took it in yet: this thread leads the next group
                self._commit_group(line.gather())
        if waiting.error is not None:
            raise waiting.error

    @property
    def queued(self) -> int:
        """New batches waiting for the next group commit."""
        return len(self._line().waiting)

    def _line(self) -> _Line:
        line: _Line | None = self.__dict__.get("_group_line")
        if line is None:
            with self._line_lock:
                line = self.__dict__.setdefault("_group_line", _Line())
        return line

    def _commit_group(self, group: list[_Waiting]) -> None:
        """Decide each in turn on the index as changed by those before it; write the files
        of the small ones unsynced; then the index once. The caller holds the store lock."""
        data = self.writable_index()
        taken: list[_Waiting] = []
        try:
            with self.group_view(data):
                for waiting in group:
                    taken.append(waiting)  # its files may be written, whatever follows
                    if not waiting.context.run(self._take, waiting, data):
                        taken.pop()
            if taken:
                self.write_index(data)
                self.fresh_ids.update(w.batch.batch_id for w in taken if w.ready is None)
        except BaseException as error:  # nothing of the group is committed
            for waiting in group:
                if waiting.error is None:
                    waiting.error = error
            for waiting in taken:
                self._remove_unnamed(waiting.batch.batch_id)
        finally:
            for waiting in group:
                waiting.done = True

    def _take(self, waiting: _Waiting, data: dict[str, dict[str, Any]]) -> bool:
        """One batch's checks and, when they pass, its files, row, hold and fresh copy."""
        try:
            hold = waiting.decide()
        except Exception as error:  # a refusal, or a duplicate found: the owner's answer
            waiting.error = error
            return False
        batch = waiting.batch
        if waiting.ready is None:
            rows = [dump(t) for t in waiting.tasks]
            record = dump(batch)
            write_table(self.tasks.live / f"{batch.batch_id}.json", TABLE, rows, False)
            write_table(self.batches_dir / f"{batch.batch_id}.json", "batch", [record], False)
            data.setdefault(FRESH, {})[batch.batch_id] = {"batch": record, TABLE: rows}
            self.index_new(data, batch, hold)
        else:
            waiting.ready(hold, into=data)
        return True

    # -- fresh copies ---------------------------------------------------------------------

    def is_fresh(self, batch_id: str) -> bool:
        """Whether the index may still hold the batch's fresh copy (this process wrote it,
        or the index last read here has it)."""
        if batch_id in self.fresh_ids:
            return True
        cached = self.cached_index()
        return cached is not None and batch_id in (cached.get(FRESH) or {})

    @contextlib.contextmanager
    def sealing(self, batch_id: str) -> Iterator[None]:
        """Around a durable write of the batch's record: a fresh batch's tasks file is
        synced first, and once the record has landed too its copy may go at the next
        index write. The caller holds the record lock."""
        fresh = self.is_fresh(batch_id)
        if fresh:
            with contextlib.suppress(FileNotFoundError):  # moved to the archive: synced
                fsync_file(self.tasks.live / f"{batch_id}.json")
        yield
        if fresh:
            self.fresh_ids.discard(batch_id)
            self.sealed_ids.add(batch_id)

    def restore_fresh(self) -> None:
        """After a restart: write back, synced, a live fresh batch's record or tasks file
        that a power loss took or left unreadable. The caller holds the store lock.

        A batch with a task journal was sealed (its journal follows the first durable
        record write), so its files are not the copy's to restore. A record written back
        says `open_started`: its issues are then adopted by marker, never created twice,
        whatever happened after the copy was taken."""
        data = self.index_data() or {}
        fresh: dict[str, Row] = data.get(FRESH) or {}
        live = {row["batch_id"] for row in data.get("batches", {}).values()}
        for batch_id, copy in fresh.items():
            base = self.tasks.live / f"{batch_id}.json"
            if batch_id not in live or self.tasks.journal(base).exists():
                continue
            with self.record_locked(batch_id):
                record = self.batches_dir / f"{batch_id}.json"
                if not _readable(record, "batch"):
                    write_table(record, "batch", [{**copy["batch"], "open_started": True}])
                if not _readable(base, TABLE):
                    write_table(base, TABLE, copy[TABLE])


def _readable(path: Any, table: str) -> bool:
    try:
        return bool(read_table(path, table))
    except Exception:  # noqa: BLE001 - missing, empty or cut short: written back
        return False
