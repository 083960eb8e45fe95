"""Gitea vs Forgejo differences the sandbox reproduces, chosen when the forge starts."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

from .errors import SandboxApiError

FlavorName = Literal["gitea", "forgejo"]
FLAVORS: tuple[FlavorName, ...] = ("gitea", "forgejo")
TITLE_LIMIT = 255
ELLIPSIS = "…"
_REPO_CHARS = re.compile(r"^[-.\w]+$", re.ASCII)
_RESERVED_NAMES = frozenset({".", "..", "-"})
_RESERVED_SUFFIXES = (".git", ".wiki", ".rss", ".atom")
_NARROW_CATEGORIES = ("M", "Cf", "Cs", "Z")


@dataclass(frozen=True)
class Flavor:
    """One forge's quirks; `repo_quota` (Forgejo only) caps repos per owner."""

    name: FlavorName = "gitea"
    repo_quota: int | None = None

    @property
    def version(self) -> str:
        """What `GET /version` answers."""
        return "1.22.0+sandbox" if self.name == "gitea" else "11.0.0+gitea-1.22.0"

    @property
    def missing_issue_status(self) -> int:
        """Status for comments/timeline of a missing issue: Gitea 500, Forgejo 404."""
        return 500 if self.name == "gitea" else 404

    def archived_message(self, repo_id: int, full_name: str) -> str:
        """The 423 of a write to an archived repo (`mustNotBeArchived`): Gitea's wording, or
        Forgejo's `<Repository id:owner/name> is archived`."""
        if self.name == "forgejo":
            return f"<Repository {repo_id}:{full_name}> is archived"
        return "repo is archived"

    def accepts_scheme(self, scheme: str) -> bool:
        """Gitea: `token`/`bearer` in any case; Forgejo: lower-case `token` or any-case bearer."""
        if self.name == "forgejo":
            return scheme == "token" or scheme.lower() == "bearer"
        return scheme.lower() in ("token", "bearer")

    def cut_title(self, title: str) -> str:
        """Truncate an issue title like the forge does when storing it."""
        if self.name == "forgejo":
            return cut_bytes(title, TITLE_LIMIT)
        return cut_display(title, TITLE_LIMIT)

    def check_repo_name(self, name: str) -> None:
        """422 for names Gitea/Forgejo refuse (bad chars, `..`, reserved names/suffixes)."""
        if not name:
            raise SandboxApiError(422, "[Name]: Required")
        if len(name) > 100 or not _REPO_CHARS.match(name):
            raise SandboxApiError(422, "[Name]: AlphaDashDot")
        if ".." in name and name != "..":
            raise SandboxApiError(
                422,
                f"name is invalid [{name}]: must be valid alpha or numeric or "
                "dash(-_) or dot characters",
            )
        if name in _RESERVED_NAMES:
            raise SandboxApiError(422, f"name is reserved [name: {name}]")
        for suffix in _RESERVED_SUFFIXES:
            if name.lower().endswith(suffix):
                raise SandboxApiError(422, f"name pattern is not allowed [pattern: *{suffix}]")

    def check_quota(self, owner_id: int, owner: str, owned: int) -> None:
        """Forgejo answers 413 when an owner already holds `repo_quota` repos."""
        if self.name == "forgejo" and self.repo_quota is not None and owned >= self.repo_quota:
            raise SandboxApiError(413, "quota exceeded", {"user_id": owner_id, "username": owner})


def display_width(char: str) -> int:
    """Gitea's width guess: Latin-1 and marks/format/space runes count 1, all others 2."""
    if ord(char) <= 255:
        return 1
    if char == "\u3000":
        return 2
    return 1 if unicodedata.category(char).startswith(_NARROW_CATEGORIES) else 2


def cut_display(text: str, limit: int) -> str:
    """Gitea's `EllipsisDisplayString`: keep runes while width + 3 fits, then add "…"."""
    if len(text.encode()) <= limit:
        return text
    used = kept = 0
    for char in text:
        width = display_width(char)
        if used + width + 3 > limit:
            break
        used += width
        kept += 1
    rest = text[kept:]
    fits = used + sum(display_width(c) for c in rest[:4]) <= limit
    if len(rest.encode()) <= 12 and len(rest) <= 3 and fits:
        return text  # at most 3 runes left and they fit: no ellipsis needed
    return text[:kept] + ELLIPSIS


def cut_bytes(text: str, limit: int) -> str:
    """Forgejo's `SplitStringAtByteN`: at most `limit - 3` UTF-8 bytes, then "…"."""
    if len(text.encode()) <= limit:
        return text
    used = kept = 0
    for char in text:
        size = len(char.encode())
        if used + size > limit - 3:
            break
        used += size
        kept += 1
    return text[:kept] + ELLIPSIS
