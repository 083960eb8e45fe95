"""Handing a file to the inbox from outside (`dropbox-eval submit`), and finding what the
inbox made of it: the receipt or error file filed beside it.

The file is copied under a hidden name and renamed into place in one `rename(2)`, so a
running service reads it at once and never half-written (namefilter: a hidden name is
never a candidate). Its document is found by name (the drop's name and the clash names
the inbox files under, `name.N.json`), never by listing a history: the one that was not
there before the drop, for the same file name and bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models import utcnow
from ..util.fileio import SHARED_MODE, write_atomically
from .filing import OUTCOME_SUFFIX
from .fsops import outcome_name

MAX_CLASHES = 100  # `name.N.json` clashes looked at when finding a filed document


@dataclass(frozen=True)
class Drop:
    """A file handed to the inbox: where it landed, its digest, and the documents filed
    under its name before it came (an earlier drop's receipt is not this drop's)."""

    path: Path
    sha256: str
    earlier: frozenset[Path]

    def filed(self) -> tuple[str, dict[str, Any]] | None:
        """(`accepted` | `rejected`, its receipt or error document) once the inbox filed
        this drop; None until then."""
        for path in documents(self.path) - self.earlier:
            document = _read(path)
            if document is not None and self._is_mine(document):
                return path.parent.name, document
        return None

    def _is_mine(self, document: dict[str, Any]) -> bool:
        # a drop refused before it was read (too large, a link) has no digest
        same_bytes = document.get("sha256") in (self.sha256, None)
        return document.get("file") == self.path.name and same_bytes


def hand_over(source: Path, folder: Path, inbox: Path) -> Drop:
    """Put a copy of `source` into `folder` (the inbox or a client's folder in it; the file
    itself when it already sits there). A missing inbox is not made: it may be a share
    not mounted yet, and the service waits for it."""
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
    if not inbox.is_dir():
        raise ConfigError(
            f"the inbox {inbox} is missing (a share not mounted yet?): the service waits "
            "for it; submit again once it is back"
        )
    folder.mkdir(exist_ok=True)
    if source.resolve().parent == folder.resolve():
        target = source.resolve()
        return Drop(target, sha256, documents(target))
    target = folder / source.name
    if target.exists():
        target = folder / f"{source.stem}.{utcnow():%Y%m%d%H%M%S%f}{source.suffix}"
    earlier = documents(target)
    write_atomically(target, source.read_bytes(), mode=SHARED_MODE)
    return Drop(target, sha256, earlier)


def documents(dropped: Path) -> frozenset[Path]:
    """The receipt and error files filed beside the folder under the drop's name (and its
    clash names `name.N.json`) now."""
    found = set()
    for outcome, suffix in OUTCOME_SUFFIX.items():
        for clash in range(MAX_CLASHES):
            path = dropped.parent / outcome / f"{outcome_name(dropped.name, suffix, clash)}{suffix}"
            if not path.exists():
                break
            found.add(path)
    return frozenset(found)


def _read(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(path.read_text(encoding="utf-8"))
        return found if isinstance(found, dict) else None
    return None
