"""Parsing and validation helpers shared by the sandbox state and routes (no HTTP)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar
from urllib.parse import urlencode

from .errors import SandboxApiError

MAX_RESPONSE_ITEMS = 50
DEFAULT_PAGING_NUM = 30
ISSUE_PAGING_NUM = 20  # setting.UI.IssuePagingNum: the default page of /repos/issues/search
REPO_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_COLOR = re.compile(r"^#([0-9a-f]{3}|[0-9a-f]{6})$")
T = TypeVar("T")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class IssueQuery:
    """Filters and paging of `GET /repos/{o}/{r}/issues`."""

    state: str = "open"
    labels: tuple[str, ...] = ()
    since: int | None = None
    before: int | None = None
    page: int = 1
    limit: int = DEFAULT_PAGING_NUM
    pulls_only: bool = False
    issues_only: bool = False


def normalize_color(color: str) -> str:
    """Normalize a label color like Gitea: `#rgb`/`rgb`/`#rrggbb`/`rrggbb` -> `rrggbb`."""
    value = color.strip().lower()
    if len(value) in (3, 6):
        value = "#" + value
    if not _COLOR.match(value):
        raise SandboxApiError(422, f"invalid color: {color}")
    digits = value[1:]
    if len(digits) == 3:
        digits = "".join(ch * 2 for ch in digits)
    return digits


def parse_time(value: str | None) -> int | None:
    """Parse a strict RFC3339 time (Z or offset) to whole unix seconds; bad values -> 422."""
    if value is None or value == "":
        return None
    error = SandboxApiError(
        422, f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse'
    )
    if not _RFC3339.match(value):
        raise error
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise error from None
    return int(parsed.timestamp() // 1)


def page_size(limit: int | None, default: int | None = None) -> int:
    """Apply Gitea's default page size (`default`, else `DEFAULT_PAGING_NUM`) and its
    silent cap at `MAX_RESPONSE_ITEMS` (`convert.ToCorrectPageSize`)."""
    if limit is None or limit <= 0:
        return default or DEFAULT_PAGING_NUM
    return min(limit, MAX_RESPONSE_ITEMS)


def paged(items: list[T], page: int | None, limit: int | None) -> list[T]:
    """One page of `items`, or all of them without a `page` >= 1: Gitea paginates these
    lists only `if opts.Page > 0` (labels, comments, the timeline)."""
    if page is None or page <= 0:
        return items
    size = page_size(limit)
    return items[(page - 1) * size : page * size]


def page_links(base: str, params: list[tuple[str, str]], page: int, limit: int, total: int) -> str:
    """Build Gitea's `Link` header (next, last, first, prev) for a paged list."""
    pages = max(1, -(-total // limit))
    kept = [(k, v) for k, v in params if k != "page"]

    def link(number: int, rel: str) -> str:
        query = urlencode(sorted([*kept, ("page", str(number))]))
        return f'<{base}?{query}>; rel="{rel}"'

    links: list[str] = []
    if page < pages:
        links += [link(page + 1, "next"), link(pages, "last")]
    if page > 1:
        links += [link(1, "first"), link(min(page - 1, pages), "prev")]
    return ",".join(links)
