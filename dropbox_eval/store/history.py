"""The history: every archived batch as one entry in a shared, append-only segment.

An emitted batch leaves its two live files (its record and its tasks) for one entry in
`archive/<YYYYMM>/history.jsonl` (the month of its id, so of its creation): a line of its
tasks, then a line of its record naming where the tasks line is. `history.idx` beside it
says where each batch's newest record line is (`<batch_id> <offset> <length>`, later
lines win). A later change to an archived record (a retry's link, a forced re-delivery)
appends the record again, pointing at the same tasks line; a batch removed for good is
replaced by a tombstone line (`bury`). So an archived batch costs no file of its own, and
a lookup costs the locator's lines added since this process last read them, then one read
of one line.

Write order: the lines first (fsynced), then the locator line (fsynced). A crash between
them leaves lines no locator names (unread bytes), and archiving again appends them again.
A reader finds a locator line's target by offset and checks it names the same batch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import storage_errors
from ..util import crashpoints
from ..util.fileio import PRIVATE_MODE, make_folders, read_blocks
from ..util.locks import SharedLock
from .files import dumps, parse_lines
from .tasks import TABLE as TASKS_TABLE

Row = dict[str, Any]
Place = tuple[int, int]  # offset and length of a line in a segment
SEGMENT = "history.jsonl"
COPY_BLOCK = 1 << 20  # bytes of a tasks file or a report copied into a segment at a time
ESCAPE_BLOCK = 1 << 16  # bytes of a report escaped at a time: orjson sets aside room for
# the worst case (about 14 bytes a character), so a 1 MB block made a 16 MB peak
LOCATOR = "history.idx"


@dataclass
class _Located:
    """A segment's locator as far as read: batch_id -> its newest record line."""

    inode: int = 0
    offset: int = 0
    places: dict[str, Place] = field(default_factory=dict)


class History:
    """The archived batches' records and tasks, one entry each, under `archive/`.
    Thread-safe; several processes may read and (under the store lock) append."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._located: dict[str, _Located] = {}
        self._lock = threading.Lock()
        # appends only: taken last, under the store lock or a record lock, never before them
        self._appending = SharedLock(folder / "history.lock")

    def _segment(self, batch_id: str) -> Path:
        return self.folder / batch_id[:6] / SEGMENT

    def add(
        self, record: Row, tasks: list[Row] | bytes | Path, report: bytes | Path | None = None
    ) -> None:
        """Archive a batch: its tasks line (and its report's, in the same append), its
        record line, then its locator line. `tasks` as bytes or a file: its tasks file, one
        line of JSON (a TinyDB table), taken as it is: nothing parsed, and a file copied
        into the segment block by block, as the report (bytes or its file) is: neither is
        held whole twice."""
        batch_id = str(record["batch_id"])
        lines = [_tasks_line(batch_id, tasks)]
        if report is not None:  # canonical JSON: ASCII (protocol/report.py)
            lines.append(_report_line(batch_id, report))
        with self._appending:
            places = _append_lines(self._segment(batch_id), lines)
            entry: Row = {"batch_id": batch_id, "batch": record, "tasks_at": list(places[0])}
            if report is not None:
                entry["report_at"] = list(places[1])
            self._write_record(batch_id, entry)

    def replace_record(self, record: Row) -> None:
        """A changed archived record: appended again, its tasks where they were."""
        batch_id = str(record["batch_id"])
        with self._appending:
            line = self._record_line(batch_id)
            if line is None or "batch" not in line:
                raise KeyError(batch_id)
            self._write_record(batch_id, {**line, "batch": record})

    def bury(self, batch_id: str, tombstone: Row) -> bool:
        """Replace an archived batch by a tombstone (`tombstone`: what stays said of it,
        such as when and why it was removed); False when the history does not hold it."""
        with self._appending:
            if self._record_line(batch_id) is None:
                return False
            self._write_record(batch_id, {"batch_id": batch_id, "tombstone": tombstone})
        return True

    def record(self, batch_id: str) -> Row | None:
        """The archived record (None: not in the history, or buried)."""
        line = self._record_line(batch_id)
        return None if line is None else line.get("batch")

    def tombstone(self, batch_id: str) -> Row | None:
        """What a buried batch's tombstone says (None: not buried)."""
        line = self._record_line(batch_id)
        return None if line is None else line.get("tombstone")

    def tasks(self, batch_id: str) -> list[Row] | None:
        """The archived tasks, in their order (None: not in the history, or buried)."""
        line = self._record_line(batch_id)
        if line is None or "tasks_at" not in line:
            return None
        found = self._read_line(self._segment(batch_id), tuple(line["tasks_at"]))
        if found is None or found.get("batch_id") != batch_id:
            return None
        if "table" in found:  # the tasks file as it was (`add`)
            rows: dict[str, Row] = found["table"].get(TASKS_TABLE, {})
            return [rows[key] for key in sorted(rows, key=int)]
        tasks: list[Row] = found["tasks"]
        return tasks

    def report(self, batch_id: str) -> bytes | None:
        """The report archived beside the record (None: none there: not in the history,
        buried, or archived with the report inside its record, as older versions did)."""
        line = self._record_line(batch_id)
        if line is None or "report_at" not in line:
            return None
        found = self._read_line(self._segment(batch_id), tuple(line["report_at"]))
        if found is None or found.get("batch_id") != batch_id:
            return None
        return str(found["report"]).encode("ascii")

    def holds(self, batch_id: str) -> bool:
        """Whether the history has an entry (or a tombstone) for the batch."""
        return self._place(batch_id) is not None

    def _write_record(self, batch_id: str, line: Row) -> None:
        at = self._append(batch_id, line)
        locator = self.folder / batch_id[:6] / LOCATOR
        _append_raw(locator, f"{batch_id} {at[0]} {at[1]}\n".encode())

    def _append(self, batch_id: str, line: Row) -> Place:
        raw = dumps(line) + b"\n"
        return _append_raw(self._segment(batch_id), raw)[0], len(raw)

    def _record_line(self, batch_id: str) -> Row | None:
        place = self._place(batch_id)
        if place is None:
            return None
        found = self._read_line(self._segment(batch_id), place)
        return found if found is not None and found.get("batch_id") == batch_id else None

    def _place(self, batch_id: str) -> Place | None:
        """Where the batch's newest record line is: the segment's locator, read from where
        this process left it (all of it again if it was replaced)."""
        month = batch_id[:6]
        path = self.folder / month / LOCATOR
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            return None
        with handle, self._lock:
            info = os.fstat(handle.fileno())
            located = self._located.get(month)
            if located is None or located.inode != info.st_ino or info.st_size < located.offset:
                located = self._located[month] = _Located(info.st_ino)
            if info.st_size > located.offset:
                handle.seek(located.offset)
                raw = handle.read(info.st_size - located.offset)
                end = raw.rfind(b"\n") + 1  # a line still being written waits
                _parse_places(raw[:end], located.places)
                located.offset += end
            return located.places.get(batch_id)

    @staticmethod
    def _read_line(path: Path, place: Place) -> Row | None:
        try:
            with path.open("rb") as handle:
                handle.seek(place[0])
                raw = handle.read(place[1])
        except FileNotFoundError:
            return None
        lines = parse_lines(raw)
        return lines[0] if len(lines) == 1 else None


def _tasks_line(batch_id: str, tasks: list[Row] | bytes | Path) -> Iterable[bytes]:
    if isinstance(tasks, Path):
        if not _has_newline(tasks):
            return _file_line(batch_id, tasks)
        with storage_errors(tasks):
            tasks = tasks.read_bytes()
    if isinstance(tasks, bytes) and b"\n" not in tasks:
        return [b'{"batch_id":%b,"table":%b}\n' % (dumps(batch_id), tasks)]
    if isinstance(tasks, bytes):
        table: dict[str, Row] = parse_lines(tasks.replace(b"\n", b" "))[0][TASKS_TABLE]
        tasks = [table[key] for key in sorted(table, key=int)]
    return [dumps({"batch_id": batch_id, "tasks": tasks}) + b"\n"]


def _file_line(batch_id: str, path: Path) -> Iterator[bytes]:
    """The tasks line of a tasks file without a newline, a block at a time."""
    yield b'{"batch_id":%b,"table":' % dumps(batch_id)
    with storage_errors(path), path.open("rb") as handle:
        yield from read_blocks(handle, COPY_BLOCK)
    yield b"}\n"


def _has_newline(path: Path) -> bool:
    with storage_errors(path), path.open("rb") as handle:
        return any(b"\n" in block for block in read_blocks(handle, COPY_BLOCK))


def _report_line(batch_id: str, report: bytes | Path) -> Iterator[bytes]:
    """`dumps({"batch_id": batch_id, "report": report.decode("ascii")})` and a newline, a
    block at a time (a file read a block at a time): each ASCII character is escaped
    alone, so the blocks' escapes put together are the whole's."""
    yield b'{"batch_id":%b,"report":"' % dumps(batch_id)
    for block in _blocks(report, ESCAPE_BLOCK):
        yield dumps(block.decode("ascii"))[1:-1]
    yield b'"}\n'


def _blocks(report: bytes | Path, size: int) -> Iterator[bytes]:
    if isinstance(report, bytes):
        for start in range(0, len(report), size):
            yield report[start : start + size]
        return
    with storage_errors(report), report.open("rb") as handle:
        yield from read_blocks(handle, size)


def _parse_places(raw: bytes, places: dict[str, Place]) -> None:
    for line in raw.split(b"\n"):
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            places[parts[0].decode()] = (int(parts[1]), int(parts[2]))


def _append_raw(path: Path, raw: bytes) -> tuple[int, int]:
    """Append `raw` (whole lines) after closing a line a crash cut short, fsync; returns
    (offset, length) of what was appended."""
    return _append_lines(path, [[raw]])[0]


def _append_lines(path: Path, lines: list[Iterable[bytes]]) -> list[Place]:
    """Append `lines`, each given in pieces that end in its newline, after closing a line
    a crash cut short; one fsync. Where each line went (offset, length)."""
    places: list[Place] = []
    with storage_errors(path):
        make_folders(path.parent)  # 0700, the file 0600: secrecy.py
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_MODE)
        with os.fdopen(fd, "a+b") as handle:
            end = handle.seek(0, os.SEEK_END)
            if end > 0:
                handle.seek(end - 1)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")
                    end += 1
            for pieces in lines:
                length = sum(handle.write(piece) for piece in pieces)
                places.append((end, length))
                end += length
            handle.flush()
            os.fsync(handle.fileno())
    crashpoints.wrote(path.name)
    return places
