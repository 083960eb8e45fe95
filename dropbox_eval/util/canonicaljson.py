"""Canonical JSON: sorted keys, an indent of 2, a final newline, ASCII only (the standard
library's `json.dumps(document, indent=2, sort_keys=True)`): the bytes of every document
written for people and programs (reports, receipts, error files), the same for the same
document whatever writes it."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import orjson

_INDENTED = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


def canonical(document: Any) -> bytes:
    """`json.dumps(document, indent=2, sort_keys=True)` and a newline, as bytes. orjson
    writes the same bytes ~15 times faster for what it writes alike (no float, printable
    ASCII only: the standard library escapes the rest); anything else goes through the
    standard library."""
    if not _has_float(document):
        with contextlib.suppress(TypeError):  # an integer past 64 bits, a key not a string
            raw = orjson.dumps(document, option=_INDENTED)  # its newline too: no copy
            if raw.isascii() and b"\x7f" not in raw:
                return raw
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("ascii")


def _has_float(document: Any) -> bool:
    """Whether a float is anywhere in a JSON-ready document."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            return True
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False
