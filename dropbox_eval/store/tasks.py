"""A batch's tasks: a base file written once, plus a journal of changes.

Intake flushes and poll cycles append only the tasks that changed (one JSON line per write,
fsynced), so a write costs the change, not the batch's size. Reading replays the journal
over the base; when the journal outgrows the base it is folded in (compaction). Replaying a
journal over a base that already holds it gives the same tasks (each line sets absolute
field values), so a crash in the middle of a compaction loses nothing.

A reader that keeps what it read (taskcache.py) keeps its `Position` too: while the base
is the same file, only the journal's lines after that position are new, so bringing the
tasks up to date costs the change, whichever process wrote it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from pydantic import BaseModel

from ..util import crashpoints
from ..util.fileio import make_folders, write_atomically
from .files import (
    append_raw,
    dumps,
    parse_line,
    read_lines,
    read_table,
    unlink_quietly,
    write_table,
)

Changes = dict[str, dict[str, Any]]
Identity = tuple[int, int, int]  # inode, size, mtime of a file: what a rewrite changes
TABLE = "tasks"
MIN_COMPACT_BYTES = 64 * 1024
CHUNK = 1000  # tasks serialised into one piece of a tasks file
BLOCK = 1 << 20  # bytes of a journal read at a time
READ_ATTEMPTS = 3  # a compaction between reading the base and its journal: read again


@dataclass(frozen=True)
class Position:
    """How far a reader got: the base it read, and the journal (its inode, 0 for none)
    replayed up to `offset` bytes."""

    base: Identity
    journal: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Appended:
    """One journal line as written: the position of a reader that had read everything
    before it, the position after it, and its bytes."""

    before: Position
    after: Position
    line: bytes

    def follows(self, position: Position) -> bool:
        """Whether a reader at `position` read everything before this line and nothing
        after (a reader of an absent journal counts when the line began the file)."""
        return position == self.before or (
            self.before.offset == 0 and position == Position(self.before.base)
        )


class TaskFiles:
    """The task files of every batch, live or archived."""

    def __init__(self, live: Path, archive: Path) -> None:
        self.live = live
        self.archive = archive
        # folds a journal into its base when it outgrows it (a reader that keeps the
        # tasks parsed does it from them: taskcache.py)
        self.compactor: Callable[[str], object] = self.compact

    def base(self, batch_id: str) -> Path:
        """The base file: in `tasks/` while live, under `archive/<YYYYMM>/tasks/` after."""
        live = self.live / f"{batch_id}.json"
        if live.exists():
            return live
        archived = self.archive / batch_id[:6] / "tasks" / f"{batch_id}.json"
        return archived if archived.exists() else live

    @staticmethod
    def journal(base: Path) -> Path:
        """The journal beside a base file."""
        return base.with_suffix(".journal")

    def create(self, batch_id: str, docs: list[dict[str, Any]]) -> None:
        """Write a new batch's tasks (one write for all)."""
        write_table(self.live / f"{batch_id}.json", TABLE, docs)

    def create_from(self, batch_id: str, tasks: Sequence[BaseModel]) -> None:
        """Write a new batch's tasks from their models (one write for all), serialised one
        at a time: no dict per task on the way."""
        try:
            write_atomically(self.live / f"{batch_id}.json", table_pieces(TABLE, tasks))
        except ValueError:  # a value pydantic's serialiser refused: nothing was written
            self.create(batch_id, [task.model_dump(mode="json") for task in tasks])

    def identity(self, batch_id: str) -> Identity | None:
        """The identity of the batch's base file now (None: it has none)."""
        return _identity(self.base(batch_id))

    def read(self, batch_id: str) -> list[dict[str, Any]]:
        """The tasks as they are now: the base with the journal replayed."""
        base = self.base(batch_id)
        docs = read_table(base, TABLE)
        replay(docs, read_lines(self.journal(base)))
        return docs

    def read_at(self, batch_id: str) -> tuple[list[dict[str, Any]], Position] | None:
        """The tasks as they are now and the position they were read at; None when the
        batch has no tasks file. The base and its journal are read as one state: a
        compaction in between (the base replaced) makes the read start again."""
        for _ in range(READ_ATTEMPTS):
            base = self.base(batch_id)
            before = _identity(base)
            if before is None:
                return None
            docs = read_table(base, TABLE)
            found = _new_lines(self.journal(base), Position(before))
            if found is not None and _identity(base) == before:
                replay(docs, found[0])
                return docs, found[1]
        return self.read(batch_id), Position((0, 0, 0))  # never matches: read again next time

    def changes_after(
        self, batch_id: str, position: Position
    ) -> tuple[Iterable[Changes], Position] | None:
        """The journal lines written since `position` (each parsed as it is taken), and
        the position after them; None
        when the base is no longer the one read there (compacted, or gone): the tasks
        must then be read whole."""
        base = self.base(batch_id)
        if _identity(base) != position.base:
            return None
        found = _new_lines(self.journal(base), position)
        if found is None or _identity(base) != position.base:
            return None  # compacted while the journal was read
        return found

    def append(self, batch_id: str, changes: Changes) -> Appended | None:
        """Journal the changed tasks; fold the journal in once it outgrows the base.
        Where the line went, as written (None when the journal was folded in). The caller
        holds the batch's record lock."""
        base = self.base(batch_id)
        identity = _identity(base)
        line = dumps(changes)
        spot = append_raw(self.journal(base), [line])
        if identity is None:  # no base: nothing to fold the journal into, nor to follow
            return None
        if spot.end > max(identity[1], MIN_COMPACT_BYTES):
            self.compactor(batch_id)
            return None
        before = Position(identity, spot.inode, spot.start)
        return Appended(before, Position(identity, spot.inode, spot.end), line)

    def compact(self, batch_id: str) -> Path:
        """Fold the journal into the base; returns the base. The caller holds the record lock."""
        base = self.base(batch_id)
        journal = self.journal(base)
        if journal.exists():
            write_table(base, TABLE, self.read(batch_id))
            unlink_quietly(journal)
        return base

    def replace_base(self, batch_id: str, tasks: Sequence[BaseModel]) -> Identity | None:
        """Write `tasks` (the batch's tasks with its journal applied) as its base and remove
        the journal; the new base's identity. None, and nothing written, when a task does
        not serialise (the caller compacts from the files). The caller holds the record
        lock."""
        base = self.base(batch_id)
        try:
            write_atomically(base, table_pieces(TABLE, tasks))
        except ValueError:  # a value pydantic's serialiser refused: nothing was written
            return None
        unlink_quietly(self.journal(base))
        return _identity(base)

    def folded(self, batch_id: str) -> Path | None:
        """The batch's tasks file with its journal folded in (one line of JSON; None: the
        batch has none). The caller holds the record lock."""
        base = self.base(batch_id)
        if self.journal(base).exists():
            self.compactor(batch_id)
        return base if base.exists() else None

    def archive_to(self, batch_id: str) -> None:
        """Move a finished batch's tasks out of `tasks/`, folded into one file."""
        live = self.live / f"{batch_id}.json"
        if not live.exists():
            return
        self.compact(batch_id)
        target = self.archive / batch_id[:6] / "tasks" / live.name
        make_folders(target.parent)
        os.replace(live, target)
        crashpoints.wrote(f"archived {live.name}")


def table_pieces(table: str, models: Sequence[BaseModel]) -> Iterator[bytes]:
    """A TinyDB file of one table, its documents `models` (numbered from 1), in pieces of
    CHUNK documents, serialised one model at a time by pydantic as the file is written:
    no dict per model on the way, and the whole never in memory. ValueError (while it is
    written) when pydantic's serialiser refuses a value (a lone surrogate)."""
    yield b'{"%b":{' % table.encode()
    for start in range(0, len(models), CHUNK):
        yield (b"," if start else b"") + b",".join(
            b'"%d":%b' % (number, model.__pydantic_serializer__.to_json(model))
            for number, model in enumerate(models[start : start + CHUNK], start + 1)
        )
    yield b"}}"


def replay(docs: list[dict[str, Any]], changes: Iterable[Changes]) -> None:
    """Apply journal lines, oldest first, to the tasks they name (in place)."""
    by_id: dict[str, dict[str, Any]] | None = None
    for change in changes:
        if by_id is None:  # not built for an empty journal
            by_id = {doc["task_id"]: doc for doc in docs}
        for task_id, fields in change.items():
            if task_id in by_id:
                by_id[task_id].update(fields)


def _identity(path: Path) -> Identity | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _new_lines(journal: Path, since: Position) -> tuple[Iterable[Changes], Position] | None:
    """The whole lines of the journal after `since` (read a block and parsed a line at a
    time as they are taken: a big catch-up never holds them all, raw or parsed), and the
    position after them; None when the journal is another file than the one read there (or
    shorter: rewritten). A last line without its newline counts once it parses (a crash cut
    the newline, which the next append writes); one still being written does not parse and
    waits. The journal stays open until its lines are taken: it is only ever appended to,
    and a compaction unlinks it, so what is read is what was there when it was opened."""
    try:
        handle = journal.open("rb")
    except FileNotFoundError:
        return ([], since) if since.journal == 0 else None
    info = os.fstat(handle.fileno())
    if since.journal not in (0, info.st_ino) or info.st_size < since.offset:
        handle.close()
        return None
    end = _whole_end(handle, since.offset, info.st_size)
    lines = _lines_in(handle, since.offset, end)
    next(lines)  # started: closing or dropping it closes the journal, taken or not
    return cast(Iterator[Changes], lines), Position(since.base, info.st_ino, end)  # no None now


def _whole_end(handle: BinaryIO, start: int, size: int) -> int:
    """Where the whole lines between `start` and `size` end (found from the end, a block
    at a time): after the last newline, or at `size` when what follows it parses."""
    position, tail = size, b""
    while position > start:
        step = min(BLOCK, position - start)
        position -= step
        handle.seek(position)
        tail = handle.read(step) + tail
        cut = tail.rfind(b"\n")
        if cut >= 0:
            return size if parse_line(tail[cut + 1 :]) is not None else position + cut + 1
    return size if parse_line(tail) is not None else start


def _lines_in(handle: BinaryIO, start: int, end: int) -> Iterator[Changes | None]:
    """None first (`_new_lines` starts it), then the lines between `start` and `end` that
    parse, in order, read a block at a time; the handle is closed once they are taken."""
    with handle:
        yield None
        handle.seek(start)
        rest, left = b"", end - start
        while left > 0 and (chunk := handle.read(min(BLOCK, left))):
            left -= len(chunk)
            lines = (rest + chunk).split(b"\n")  # not splitlines(): U+2028 is no line end
            rest = lines.pop()
            for line in lines:
                change = parse_line(line)
                if change is not None:
                    yield change
        change = parse_line(rest)
        if change is not None:
            yield change
