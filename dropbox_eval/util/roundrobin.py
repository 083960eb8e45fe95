"""RoundRobin: the one rule for serving clients in turn (weighted round robin).

Each client (a key) has a first-in, first-out line of waiting items. Keys with items waiting
stand in a line of turns; the key at its head is served `weight_of(key)` items (at least
one), or fewer when its line empties, and then goes to the back with a fresh turn. A key
whose line empties leaves; its next item puts it at the back. So one key's backlog delays
another key's next item by at most one turn of every other waiting key.

The forge's scheduler (forge/scheduler.py) serves waiting forge calls by it, and the inbox
worker (workers/inbox.py) its ready files. Not thread-safe: its owner holds its own lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class RoundRobin(Generic[T]):
    """Per-key lines served in weighted turns, each line at most `bound` items long."""

    def __init__(
        self, weight_of: Callable[[str], int] | None = None, *, bound: int | None = None
    ) -> None:
        """`weight_of` gives a key's items per turn (1 by default); `bound`, when given,
        is how many items one key may have waiting (`push` refuses more)."""
        if bound is not None and bound < 1:
            raise ValueError("bound must be at least 1")
        self._weight_of = weight_of or (lambda _key: 1)
        self._bound = bound
        self._lines: dict[str, deque[T]] = {}
        self._turns: deque[str] = deque()  # keys with items waiting, in serving order
        self._left = 0  # items left in the turn of the key at the head of `_turns`
        self._size = 0

    def __len__(self) -> int:
        """Items waiting, all keys together."""
        return self._size

    def count(self, key: str) -> int:
        """Items waiting for `key`."""
        line = self._lines.get(key)
        return 0 if line is None else len(line)

    def counts(self) -> dict[str, int]:
        """Items waiting, per key that has any."""
        return {key: len(line) for key, line in self._lines.items()}

    def full(self, key: str) -> bool:
        """Whether `key` has as many items waiting as the bound allows."""
        return self._bound is not None and self.count(key) >= self._bound

    def push(self, key: str, item: T) -> bool:
        """Put `item` at the end of `key`'s line; False (nothing kept) when it is full."""
        if self.full(key):
            return False
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = deque()
            self._turns.append(key)
            if len(self._turns) == 1:
                self._left = self._weight(key)
        line.append(item)
        self._size += 1
        return True

    def pop(self) -> tuple[str, T]:
        """The next item by the turns, with its key (IndexError when nothing waits)."""
        if not self._turns:
            raise IndexError("pop from an empty RoundRobin")
        key = self._turns[0]
        line = self._lines[key]
        item = line.popleft()
        self._size -= 1
        self._left -= 1
        if not line or self._left == 0:
            self._turns.popleft()
            if line:  # back of the line, a fresh turn
                self._turns.append(key)
            else:
                del self._lines[key]
            if self._turns:
                self._left = self._weight(self._turns[0])
        return key, item

    def _weight(self, key: str) -> int:
        return max(1, self._weight_of(key))
