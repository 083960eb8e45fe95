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
from pathlib import Path
from typing import Any

import orjson
from tinydb.storages import Storage

from ..errors import StoreError, storage_errors
from ..util import crashpoints
from ..util.fileio import write_atomically

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
    a read costs a read and a comparison, not a parse, unless another process changed it.
    Its callers must not edit what `read` returns. Thread-safe."""

    def __init__(self) -> None:
        self._bytes: bytes | None = None
        self._data: dict[str, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def read(self, path: Path) -> dict[str, dict[str, Any]] | None:
        """The parsed file, None when there is none (StoreError when it is unreadable)."""
        raw = _read_bytes(path)
        if raw is None:
            return None
        with self._lock:
            if raw == self._bytes:
                return self._data
        data = _parsed(path, raw)
        with self._lock:
            self._bytes, self._data = raw, data
        return data

    def write(self, path: Path, data: dict[str, dict[str, Any]]) -> None:
        """Replace the file atomically with `data` (which the caller no longer edits)."""
        raw = dumps(data)
        write_atomically(path, raw)
        with self._lock:
            self._bytes, self._data = raw, data


def write_table(path: Path, table: str, docs: list[dict[str, Any]]) -> None:
    """A whole TinyDB file of one table in one atomic write."""
    AtomicJSONStorage(str(path)).write({table: {str(i): d for i, d in enumerate(docs, 1)}})


def read_table(path: Path, table: str) -> list[dict[str, Any]]:
    """The documents of one table of a TinyDB file, in document order."""
    data = AtomicJSONStorage(str(path)).read() or {}
    rows = data.get(table, {})
    return [rows[key] for key in sorted(rows, key=int)]


def append_lines(path: Path, docs: list[dict[str, Any]]) -> None:
    """Append one JSON line per document and fsync (a line a crash cut short is closed)."""
    if not docs:
        return
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+b") as handle:
            if handle.tell() > 0:
                handle.seek(handle.tell() - 1)
                if handle.read(1) != b"\n":  # finish a line a crash cut short
                    handle.write(b"\n")
            handle.write(b"".join(dumps(d) + b"\n" for d in docs))
            handle.flush()
            os.fsync(handle.fileno())
    crashpoints.wrote(path.name)


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


def newest_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a JSON-lines file, newest first, read backwards block by block: the
    cost is the number of lines taken, not the size of the file."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        position = handle.seek(0, os.SEEK_END)
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
            for line in reversed(lines):
                doc = _parse(line)
                if doc is not None:
                    yield doc
        doc = _parse(rest)
        if doc is not None:
            yield doc


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
