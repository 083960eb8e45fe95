"""Flags every node sharing a store sees at once: the pause (intake/pause.py) is the one
kept today. The TinyDB engine has none (`Store.flags()` is None): its state folder's
files are shared already by every process on the machine. The PostgreSQL engine keeps
them as rows (store/pg/flags.py), so that `pause` on one node pauses every node."""

from __future__ import annotations

from typing import Any, Protocol


class Flags(Protocol):
    """Named records shared through the store."""

    def get(self, name: str) -> dict[str, Any] | None:
        """The flag's record, or None when it is not set."""
        ...

    def set_first(self, name: str, record: dict[str, Any]) -> dict[str, Any]:
        """Set the flag unless it is set already; the record that holds afterwards."""
        ...

    def clear(self, name: str) -> dict[str, Any] | None:
        """Clear the flag; the record that was set, or None."""
        ...
