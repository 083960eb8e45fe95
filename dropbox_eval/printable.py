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
import unicodedata

_BIDI_CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_NAMED = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _unsafe(code: int) -> bool:
    category = unicodedata.category(chr(code))
    return category in ("Cc", "Cs", "Zl", "Zp") or code in _BIDI_CONTROLS


def _escape(code: int) -> str:
    if code in _NAMED:
        return _NAMED[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_UNSAFE = [code for code in range(0xE000) if _unsafe(code)]  # none above the surrogates
ESCAPES = {code: _escape(code) for code in _UNSAFE}
_UNSAFE_RE = re.compile("[" + "".join(re.escape(chr(code)) for code in _UNSAFE) + "]")


def printable(text: str) -> str:
    """`text` with every control, separator, bidi-override or surrogate character escaped
    (`\\n`, `\\x1b`, `\\u202e`); everything else, backslashes included, is left as it is."""
    return text.translate(ESCAPES)


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
