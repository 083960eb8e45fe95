"""Atomic file replacement shared by the store, the inbox and the file emitter."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new file, never a mix.

    Temp file in the same folder, flush, fsync, rename over the target, fsync the folder.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, data: Any) -> None:
    """Atomically write `data` as indented JSON (what people and programs read)."""
    write_atomically(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def fsync_dir(folder: Path) -> None:
    """Make a rename or unlink in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
