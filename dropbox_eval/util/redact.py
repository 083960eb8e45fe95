"""URLs as they may be shown: in an error, a log line or a stored file.

User info (`user:password@`) in a URL is a credential; every place that echoes a URL the
service did not build itself shows it through `shown_url`, which masks it as `***@`.
"""

from __future__ import annotations


def shown_url(url: object) -> str:
    """`url` with any user info in its authority masked (`http://***@host/path`)."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:end]
    if "@" not in authority:
        return text
    host = authority.rpartition("@")[2]
    return f"{scheme}://***@{host}{rest[end:]}"
