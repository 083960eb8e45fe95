"""Text from clients as a log line or a terminal may carry it.

File names, SSH user names and paths come from clients. Written raw, a newline in one forges
a second log line, and an escape sequence (ESC, CSI) rewrites the operator's terminal.
`printable` escapes every such character: control characters (C0, DEL, C1), line and
paragraph separators, bidirectional overrides (which make a name read backwards) and the
lone surrogates of a file name that is not UTF-8. The log formatters pass every message
through it; `unprintable_reason` is the rule for refusing such a name at the door.
"""

from __future__ import annotations

import re

BIDI_RANGES = (
    (0x061C, 0x061C),  # Arabic letter mark
    (0x200E, 0x200F),  # left-to-right and right-to-left marks
    (0x202A, 0x202E),  # bidi embeddings and overrides
    (0x2066, 0x2069),  # bidi isolates
)
"""The bidirectional controls: text holding one reads in another order than it is stored
(`evil\u202egpj.exe` shows as `evilexe.jpg`), in a file name as in a task's title."""
UNSAFE_RANGES = (
    (0x00, 0x1F),  # C0 controls: newline, tab, ESC ...
    (0x7F, 0x9F),  # DEL and the C1 controls (0x9B is a one-byte CSI)
    (0x2028, 0x2029),  # line and paragraph separators
    *BIDI_RANGES,
    (0xD800, 0xDFFF),  # surrogates: the undecodable bytes of a name that is not UTF-8
)
"""Every character of the Unicode categories Cc, Cs, Zl and Zp, and the bidi controls."""
_NAMED = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _escape(code: int) -> str:
    if code in _NAMED:
        return _NAMED[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _character_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "[" + "".join(f"\\u{low:04x}-\\u{high:04x}" for low, high in ranges) + "]"


_UNSAFE_RE = re.compile(_character_class(UNSAFE_RANGES))
_BIDI_RE = re.compile(_character_class(BIDI_RANGES))
BIDI_CLASS = _character_class(BIDI_RANGES)
"""The bidi controls as a regular-expression class (for the JSON Schemas' patterns)."""


def printable(text: str) -> str:
    """`text` with every control, separator, bidi-override or surrogate character escaped
    (`\\n`, `\\x1b`, `\\u202e`); everything else, backslashes included, is left as it is."""
    return _UNSAFE_RE.sub(lambda found: _escape(ord(found.group())), text)


def unprintable_reason(name: str) -> str | None:
    """Why `name` cannot be taken as a file name (it holds a character `printable` would
    escape), or None when it can."""
    found = _UNSAFE_RE.search(name)
    if found is None:
        return None
    return (
        f"the name contains a control character ({printable(found.group())}, "
        f"U+{ord(found.group()):04X}): use letters, digits and punctuation only"
    )


def bidi_reason(text: str) -> str | None:
    """Why client text (a task's title, body or acceptance item, a metadata value) cannot
    be taken: it holds a bidirectional control, refused as in file names; None when not."""
    found = _BIDI_RE.search(text)
    if found is None:
        return None
    return (
        f"must not contain bidirectional control characters ({printable(found.group())}, "
        f"U+{ord(found.group()):04X}): they make text read in another order than it is stored"
    )
