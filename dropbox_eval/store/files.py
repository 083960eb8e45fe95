"""The store's file formats: atomically replaced TinyDB files and append-only JSON lines.

Every TinyDB file is replaced atomically (temp file, fsync, rename, fsync of the folder), so
a crash or a concurrent reader never sees half a file. JSON-lines files are appended with an
fsync; a line cut short by a crash is skipped when read and closed by the next append.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from tinydb.storages import Storage

from ..errors import StoreError, storage_errors
from ..util import crashpoints
from ..util.fileio import PRIVATE_MODE, make_folders, write_atomically

BLOCK = 1 << 13
MAX_BLOCK = 1 << 20


class AtomicJSONStorage(Storage):
    """TinyDB storage that re-reads per call and replaces the file atomically on write."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)

    def read(self) -> dict[str, dict[str, Any]] | None:
        raw = _read_bytes(self._path)
        return None if raw is None else _parsed(self._path, raw)

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        write_atomically(self._path, dumps(data))

    def close(self) -> None:
        """Nothing is held open between calls."""


class ParsedFile:
    """A JSON file's last parsed (or written) contents, kept while its bytes are the same:
    a read costs a stat, not a parse, unless another process changed it. Its callers must
    not edit what `read` returns. Thread-safe.

    The file read last is kept open, so its inode number cannot name another file: while
    the path names that inode with the size and times it had when read, it is unchanged
    (the store replaces the file on every write; the times catch a write in place)."""

    def __init__(self) -> None:
        self._bytes: bytes | None = None
        self._data: dict[str, dict[str, Any]] | None = None
        self._held: int | None = None  # a descriptor of the file `_bytes` came from
        self._seen: tuple[int, ...] | None = None  # that file's identity when read
        self._lock = threading.Lock()

    def cached(self) -> dict[str, dict[str, Any]] | None:
        """What was last read or written here, without looking at the file."""
        return self._data

    def read(self, path: Path) -> dict[str, dict[str, Any]] | None:
        """The parsed file, None when there is none (StoreError when it is unreadable)."""
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        with self._lock:
            if self._held is not None and _identity(info) == self._seen:
                return self._data
        fd, raw, seen = _read_held(path)
        if fd is None or raw is None:
            return None
        with self._lock:
            if raw == self._bytes:
                self._hold(fd, seen)
                return self._data
        try:
            data = _parsed(path, raw)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._bytes, self._data = raw, data
            self._hold(fd, seen)
        return data

    def write(self, path: Path, data: dict[str, dict[str, Any]]) -> None:
        """Replace the file atomically with `data` (which the caller no longer edits)."""
        raw = dumps(data)
        write_atomically(path, raw)
        with self._lock:  # the next read compares its bytes once, and holds it
            self._bytes, self._data = raw, data
            self._hold(None, None)

    def __del__(self) -> None:
        if self._held is not None:
            with contextlib.suppress(OSError):
                os.close(self._held)

    def _hold(self, fd: int | None, seen: tuple[int, ...] | None) -> None:
        if self._held is not None:
            os.close(self._held)
        self._held, self._seen = fd, seen


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def write_table(path: Path, table: str, docs: list[dict[str, Any]], durable: bool = True) -> None:
    """A whole TinyDB file of one table in one atomic write (`durable`: see fileio)."""
    data = {table: {str(i): d for i, d in enumerate(docs, 1)}}
    if durable:
        AtomicJSONStorage(str(path)).write(data)
    else:
        write_atomically(path, dumps(data), durable=False)


def read_table(path: Path, table: str) -> list[dict[str, Any]]:
    """The documents of one table of a TinyDB file, in document order."""
    data = AtomicJSONStorage(str(path)).read() or {}
    rows = data.get(table, {})
    return [rows[key] for key in sorted(rows, key=int)]


def append_lines(path: Path, docs: list[dict[str, Any]]) -> None:
    """Append one JSON line per document and fsync (a line a crash cut short is closed)."""
    if docs:
        append_raw(path, [dumps(d) for d in docs])


def append_raw(path: Path, lines: list[bytes]) -> Spot:
    """Append `lines` (JSON, each without its newline) and fsync; where they went."""
    with storage_errors(path):
        make_folders(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_MODE)
        with os.fdopen(fd, "a+b") as handle:
            start = handle.tell()
            if start > 0:
                handle.seek(start - 1)
                if handle.read(1) != b"\n":  # finish a line a crash cut short
                    handle.write(b"\n")
            handle.write(b"".join(line + b"\n" for line in lines))
            handle.flush()
            os.fsync(handle.fileno())
            spot = Spot(os.fstat(handle.fileno()).st_ino, start, handle.tell())
    crashpoints.wrote(path.name)
    return spot


@dataclass(frozen=True)
class Spot:
    """Where an append went: the file's inode, its size before, and its size after."""

    inode: int
    start: int
    end: int


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a JSON-lines file, oldest first."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return parse_lines(raw)


def parse_lines(raw: bytes) -> list[dict[str, Any]]:
    """The whole JSON lines of `raw`, in order; a line a crash cut short is skipped."""
    lines = raw.split(b"\n")  # not splitlines(): U+2028 is no line end
    return [doc for doc in map(_parse, lines) if doc is not None]


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One JSON line as `parse_lines` takes it: None when blank or cut short by a crash."""
    return _parse(line)


def newest_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a JSON-lines file, newest first, read backwards block by block: the
    cost is the number of lines taken, not the size of the file."""
    for _offset, doc in newest_lines_at(path):
        yield doc


def newest_lines_at(path: Path, end: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(offset, line) of each line that starts before `end` (the file's end if None),
    newest first, read backwards block by block: a cursor is the offset of the last line
    taken, and the cost is the number of lines taken, not the size of the file."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        size = handle.seek(0, os.SEEK_END)
        position = size if end is None else max(0, min(end, size))
        rest = b""
        block = BLOCK
        while position > 0:
            step = min(block, position)
            block = min(block * 2, MAX_BLOCK)  # a small page reads little, a long scan fast
            position -= step
            handle.seek(position)
            chunk = handle.read(step) + rest
            lines = chunk.split(b"\n")
            rest = lines.pop(0)
            start = position + len(chunk)
            for line in reversed(lines):
                start -= len(line) + 1
                doc = _parse(line)
                if doc is not None:
                    yield start + 1, doc
        doc = _parse(rest)
        if doc is not None:
            yield 0, doc


def _parse(line: str | bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    with contextlib.suppress(ValueError):  # a line cut short by a crash mid-append
        doc = json.loads(line)
        return doc if isinstance(doc, dict) else None
    return None


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON, as orjson writes it (the index's encode was the largest cost of
    a drop); what orjson refuses (an integer past 64 bits, a lone surrogate, from a lane's
    result or an operator's figure) goes through the standard library, escaped. Reads use
    the standard library: orjson reads a long integer as a float, losing digits."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, separators=(",", ":")).encode("ascii")


def _read_held(path: Path) -> tuple[int | None, bytes | None, tuple[int, ...] | None]:
    """An open descriptor of a file, its whole bytes, and its identity before they were
    read (all None when there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    try:
        seen = _identity(os.fstat(fd))
        with os.fdopen(os.dup(fd), "rb") as handle:
            return fd, handle.read(), seen
    except BaseException:
        os.close(fd)
        raise


def _read_bytes(path: Path) -> bytes | None:
    """A whole file, None when there is none (StoreError when it cannot be read)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc


def _parsed(path: Path, text: str | bytes) -> dict[str, dict[str, Any]]:
    try:
        data: dict[str, dict[str, Any]] = json.loads(text)
    except ValueError as exc:  # not JSON, or not UTF-8
        # Never fall back to "empty": the next write would wipe the database.
        raise StoreError(f"{path} is corrupt ({exc}); restore it from a copy") from exc
    return data


def unlink_quietly(path: Path) -> None:
    """Remove a file that may already be gone."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        crashpoints.wrote(f"removed {path.name}")
