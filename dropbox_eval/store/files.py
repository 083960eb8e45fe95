"""The store's file formats: atomically replaced TinyDB files and append-only JSON lines.

Every TinyDB file is replaced atomically (temp file, fsync, rename, fsync of the folder), so
a crash or a concurrent reader never sees half a file. JSON-lines files are appended with an
fsync; a line cut short by a crash is skipped when read and closed by the next append.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinydb.storages import Storage

from .. import crashpoints
from ..errors import StoreError
from ..fileio import write_atomically

BLOCK = 1 << 13
MAX_BLOCK = 1 << 20


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
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as handle:
        if handle.tell() > 0:
            handle.seek(handle.tell() - 1)
            if handle.read(1) != "\n":  # finish a line a crash cut short
                handle.write("\n")
        handle.write("".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs))
        handle.flush()
        os.fsync(handle.fileno())
    crashpoints.wrote(path.name)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a JSON-lines file, oldest first."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
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


def unlink_quietly(path: Path) -> None:
    """Remove a file that may already be gone."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        crashpoints.wrote(f"removed {path.name}")
