"""The one timestamp format everything shows: RFC 3339, UTC, whole seconds, `Z`.

`2026-12-01T04:08:47Z` is what the CLI, the API, the page, receipts, error files and
reports say. Records keep their full precision on disk; only what is shown is formatted
here. A stored time without an offset is UTC (every time this package writes is).
"""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Current time, timezone-aware UTC, whole microseconds."""
    return datetime.now(UTC)


def parse(moment: datetime | str) -> datetime:
    """A stored time (a datetime or its ISO text) as an aware UTC datetime."""
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def rfc3339(moment: datetime | str | None) -> str | None:
    """`moment` as RFC 3339 UTC with `Z` and whole seconds; None stays None."""
    if moment is None or moment == "":
        return None
    return parse(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def restamped(text: str | None) -> str | None:
    """A message that starts with the time it happened (`<time> what: error`, as status
    files keep them) with that time in the one format; other text as it is."""
    if not text:
        return text
    moment, sep, rest = text.partition(" ")
    try:
        return f"{rfc3339(moment)}{sep}{rest}"
    except ValueError:  # it starts with no time
        return text


def now() -> str:
    """The current time in the one format."""
    return utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def age(moment: datetime | str, reference: datetime | None = None) -> str:
    """How long before `reference` (now) `moment` was, in its largest whole unit: `3m`."""
    seconds = max(0, int(((reference or utcnow()) - parse(moment)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
