"""ReadPool: one repo visit's issue reads, a page of the listing at a time, on one set of
threads.

A listing of a big batch names tens of thousands of issues. Holding them all (the issue
models, a pending read and a future for each) until every one was read costs memory in
proportion to the batch; reading each page's issues as the page arrives, on threads kept
for the whole visit, holds one page's worth at a time whatever the batch's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from itertools import islice
from types import TracebackType
from typing import TypeVar

from ..errors import ForgeError
from ..forge.client import PAGE_LIMIT, GiteaClient
from .reading import READERS

T = TypeVar("T")
CHUNK = 4 * PAGE_LIMIT  # issues read per round: a few pages, enough to keep READERS busy


class ReadPool:
    """Runs reads of one visit in parallel (`READERS` at most), the threads started once."""

    def __init__(self, gitea: GiteaClient) -> None:
        self.gitea = gitea
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ReadPool:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def run(self, reads: list[Callable[[], T]], calls: int) -> list[T | ForgeError]:
        """Each read's outcome, or the forge error that delays that read only (one issue's
        read never fails the others'). In parallel when `calls` of them ask the forge: each
        waits its client's turn at the scheduler, so the budget bounds them, not this
        pool. Every read sees the listing's forge time as it is now."""
        gitea = self.gitea
        listed_at = gitea.listed_at  # the listing's forge time, for every reader

        def read(one: Callable[[], T]) -> T | ForgeError:
            gitea.listed_at = listed_at
            try:
                return one()
            except ForgeError as exc:
                return exc

        if calls <= 1:
            return [read(one) for one in reads]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="read")
        context = copy_context()
        return list(self._pool.map(lambda one: context.copy().run(read, one), reads))


def chunks(items: Iterable[T], size: int = CHUNK) -> Iterator[list[T]]:
    """`items` in lists of `size` (the last one shorter), pulled from `items` as needed."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk
