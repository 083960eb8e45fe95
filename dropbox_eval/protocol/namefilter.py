"""NameFilter: the one rule for which names in the inbox count, shared by the scanner, the
watcher and the SFTP view.

A name is one of four kinds:

- `candidate`: a drop the inbox reads (`*.json`, or JSON Lines `*.jsonl` / `*.ndjson`, in
  any case, not hidden, not temporary);
- `temporary`: an upload in progress under a temporary suffix (`x.json.part`, WinSCP's
  `x.json.filepart`, ...): left alone until it is renamed to a candidate;
- `hidden`: a dot name, the other way upload tools hide a file in progress (rsync's
  `.x.json.AbC123`, lftp's `.in.x.json`): left alone until it is renamed, like a temporary
  name;
- `other`: anything else (`notes.txt`, `x.json.lftp`): never read, and never writable over
  SFTP.

Where a name counts is the inbox's layout: a candidate is a file at the top of the inbox or
in one client folder below it, never in a hidden folder or in a folder whose name is a
reserved client id (`accepted/`, `rejected/`, ...; names.reserved_reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..util.names import DROP_SUFFIX, TEMP_SUFFIXES, is_reserved_client_id
from .batchlines import LINES_SUFFIXES


class NameKind(StrEnum):
    """What a file name means to the inbox (see the module docstring)."""

    CANDIDATE = "candidate"
    TEMPORARY = "temporary"
    HIDDEN = "hidden"
    OTHER = "other"


@dataclass(frozen=True)
class NameFilter:
    """Says which names are candidates, temporary or hidden (see the module docstring)."""

    drop_suffix: str = DROP_SUFFIX
    lines_suffixes: tuple[str, ...] = LINES_SUFFIXES
    temporary_suffixes: tuple[str, ...] = TEMP_SUFFIXES

    def kind(self, name: str) -> NameKind:
        """The kind of one file name (no folder part)."""
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            return NameKind.OTHER
        if name.startswith("."):
            return NameKind.HIDDEN
        lowered = name.lower()
        if lowered.endswith(self.temporary_suffixes):
            return NameKind.TEMPORARY
        if lowered.endswith((self.drop_suffix, *self.lines_suffixes)):
            return NameKind.CANDIDATE
        return NameKind.OTHER

    def is_hidden(self, name: str) -> bool:
        """A dot name: never listed by the inbox, never a folder it enters."""
        return self.kind(name) is NameKind.HIDDEN

    def is_upload(self, name: str) -> bool:
        """A name a client may upload, rename or remove: a candidate, or a temporary or
        hidden name that becomes one by a rename."""
        return self.kind(name) is not NameKind.OTHER

    def is_client_folder(self, name: str) -> bool:
        """A folder at the top of the inbox whose files may be candidates."""
        return not self.is_hidden(name) and not is_reserved_client_id(name)

    def is_candidate(self, root: Path, path: Path) -> bool:
        """A candidate file name at the top of the inbox `root` or in one client folder."""
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            return False
        if not parts or len(parts) > 2:
            return False
        if len(parts) == 2 and not self.is_client_folder(parts[0]):
            return False
        return self.kind(parts[-1]) is NameKind.CANDIDATE

    def candidate_names(self) -> str:
        """The rule in words, for messages: what a client may write."""
        suffixes = ", ".join(f"*{s}" for s in self.temporary_suffixes)
        batches = ", ".join(f"*{s}" for s in (self.drop_suffix, *self.lines_suffixes))
        return (
            f"{batches} files, temporary names ({suffixes}) and hidden names "
            "(.name) that are renamed to one of those"
        )


NAMES = NameFilter()
"""The filter every part of the product uses."""
