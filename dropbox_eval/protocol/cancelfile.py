"""A cancel request: a file named `cancel-<batch_id>.json`, dropped in the client's folder,
that holds nothing or an empty JSON object `{}`. Both name and content make it one: a file
of that name holding anything else is read as a batch, so a batch may be called anything
(`cancel-me.json` included). The inbox and `dropbox-eval validate` ask this one rule.
"""

from __future__ import annotations

import re

CANCEL_NAME_RE = re.compile(r"^cancel-(.+)\.json$")
# nothing, or `{}`, with JSON's whitespace around and an optional UTF-8 byte-order mark
_CANCEL_BODY_RE = re.compile(rb"^(?:\xef\xbb\xbf)?[ \t\r\n]*(?:\{[ \t\r\n]*\})?[ \t\r\n]*$")


def cancel_request_of(name: str, raw: bytes) -> str | None:
    """The batch id that a drop named `name` holding `raw` asks to cancel; None when the
    drop is a batch (any other name, or any other content)."""
    match = CANCEL_NAME_RE.match(name)
    if match is None or not _CANCEL_BODY_RE.match(raw):
        return None
    return match.group(1)
