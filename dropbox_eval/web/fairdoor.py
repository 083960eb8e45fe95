"""FairDoor: batches posted to the API wait in one line per client, served in weighted turns.

A post takes a place at the door as soon as its client is known (before its body is read):
at most `SAAS_EVAL_API_CLIENT_BACKLOG` posts of one client and `SAAS_EVAL_API_BACKLOG` of
all clients hold a place at once; one more is refused at once (TooManyWaiting, 429, or
DoorFull, 503, both with `Retry-After`), its body unread. A post whose body is read and
parsed waits in its client's line for a seat; SEATS posts are taken in at once, the next
one chosen by the turns of util/roundrobin.py (the inbox's and the forge scheduler's rule,
with `SAAS_EVAL_CLIENT_WEIGHTS`). So however many posts one client has waiting, another
client's next post waits for at most one turn of each client with posts waiting, plus the
posts already seated.

Every method runs on the event loop's thread (a seat is given by resolving the waiting
post's future), so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..errors import DoorFull, TooManyWaiting
from ..util.roundrobin import RoundRobin

if TYPE_CHECKING:
    from ..config import Settings

SEATS = 4  # posts taken in at once, as the inbox has workers: more only share the CPU and the store
RETRY_AFTER = 1  # seconds: a place frees within a few turns


class FairDoor:
    """The API's door for new batches (one per web app)."""

    def __init__(self, settings: Settings, seats: int = SEATS) -> None:
        """The bounds are read from `settings` at each post; the weights once."""
        weights = settings.weights
        self.settings = settings
        self._line: RoundRobin[asyncio.Future[None]] = RoundRobin(
            lambda client: weights.get(client, 1)
        )
        self._held: dict[str, int] = {}  # places per client: waiting, parsing or seated
        self._free = seats

    def held(self) -> dict[str, int]:
        """Places held now, per client that holds any."""
        return dict(self._held)

    def waiting(self) -> dict[str, int]:
        """Posts waiting for a seat now, per client (one dropped meanwhile until its turn
        passes it over)."""
        return self._line.counts()

    @contextlib.asynccontextmanager
    async def place(self, client_id: str) -> AsyncIterator[Place]:
        """A place for one post of `client_id`, given back when the block ends (raises
        TooManyWaiting or DoorFull when there is none)."""
        self._enter(client_id)
        place = Place(self, client_id)
        try:
            yield place
        finally:
            self._leave(place)

    def _enter(self, client_id: str) -> None:
        own = self._held.get(client_id, 0)
        if own >= self.settings.api_client_backlog:
            raise TooManyWaiting(
                f"you have {own} batches waiting at the API, as many as it holds for one "
                f"client (SAAS_EVAL_API_CLIENT_BACKLOG); try again in {RETRY_AFTER} s",
                retry_after=RETRY_AFTER,
            )
        if sum(self._held.values()) >= self.settings.api_backlog:
            raise DoorFull(
                "the API holds as many waiting batches as it may (SAAS_EVAL_API_BACKLOG); "
                f"try again in {RETRY_AFTER} s",
                retry_after=RETRY_AFTER,
            )
        self._held[client_id] = own + 1

    def _leave(self, place: Place) -> None:
        self._held[place.client_id] -= 1
        if not self._held[place.client_id]:
            del self._held[place.client_id]
        if place.seated:
            self._free += 1
            self._seat_next()

    def line_up(self, client_id: str) -> asyncio.Future[None]:
        """A post of `client_id` joins its line: the future resolves when it is seated."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.push(client_id, future)
        self._seat_next()
        return future

    def _seat_next(self) -> None:
        """Give the free seats to the next waiting posts by the turns (a post whose
        request was dropped while it waited is passed over)."""
        while self._free and self._line:
            _client, future = self._line.pop()
            if not future.done():
                future.set_result(None)
                self._free -= 1


class Place:
    """One post's place at the door."""

    def __init__(self, door: FairDoor, client_id: str) -> None:
        self.door = door
        self.client_id = client_id
        self.seated = False

    async def turn(self) -> None:
        """Wait in the client's line until the turns give this post a seat."""
        future = self.door.line_up(self.client_id)
        try:
            await future
        finally:  # a seat given just as the request was dropped is given back on leaving
            self.seated = future.done() and not future.cancelled()
