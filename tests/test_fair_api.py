"""Fair intake at the HTTP API: batches posted to `POST /api/eval/batches` wait in one line
per client, taken in by weighted turns (the inbox's rule), so one client's flood of posts
never stands in front of another client's post; what one client (and all together) may have
waiting is bounded, and a post past it is refused at once, 429 or 503 with `Retry-After`."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from conftest import tasks, wait_for

from dropbox_eval.app import App
from dropbox_eval.config import load_settings
from dropbox_eval.errors import DoorFull, TooManyWaiting
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api
from dropbox_eval.web.fairdoor import SEATS, FairDoor

FLOOD = 40


class Posts:
    """Posts held at a FairDoor on one event loop, each keeping its seat until released:
    the order they were seated in."""

    def __init__(self, door: FairDoor) -> None:
        self.door = door
        self.seated: list[str] = []
        self.releases: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def arrive(self, client: str, name: str) -> None:
        """A post of `client` comes, takes its place and lines up (its turn may come now)."""
        self.releases[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._post(client, name))
        for _ in range(3):  # into its line (or its seat) before the next one comes
            await asyncio.sleep(0)

    async def _post(self, client: str, name: str) -> None:
        async with self.door.place(client) as place:
            await place.turn()
            self.seated.append(name)
            await self.releases[name].wait()

    async def release_in_turn(self) -> None:
        """Let the seated posts go one at a time until every post was seated and left."""
        while not all(task.done() for task in self.tasks.values()):
            held = [name for name in self.seated if not self.releases[name].is_set()]
            if held:
                self.releases[held[0]].set()
            await asyncio.sleep(0)


def door_for(tmp_path: Path, seats: int = 1, **settings: Any) -> FairDoor:
    return FairDoor(load_settings(home=tmp_path, **settings), seats=seats)


def test_posts_are_seated_client_by_client_by_the_weights(tmp_path: Path) -> None:
    door = door_for(tmp_path, client_weights="big=2")

    async def scenario() -> list[str]:
        posts = Posts(door)
        for index in range(6):
            await posts.arrive("big", f"big{index}")
        await posts.arrive("small", "small0")
        await posts.arrive("small", "small1")
        assert door.held() == {"big": 6, "small": 2}
        await posts.release_in_turn()
        return posts.seated

    # FIFO would seat small0 7th; by turns it waits for one turn of big (2 posts, its weight)
    assert asyncio.run(scenario()) == [
        *("big0", "big1", "big2", "small0"),
        *("big3", "big4", "small1", "big5"),
    ]
    assert door.held() == {}


def test_each_client_and_the_whole_door_hold_a_bounded_number_of_posts(tmp_path: Path) -> None:
    door = door_for(tmp_path, api_client_backlog=2, api_backlog=3)

    async def scenario() -> None:
        posts = Posts(door)
        await posts.arrive("a", "a0")
        await posts.arrive("a", "a1")
        with pytest.raises(TooManyWaiting) as mine:
            async with door.place("a"):
                pass
        assert mine.value.retry_after >= 1
        await posts.arrive("b", "b0")
        with pytest.raises(DoorFull):
            async with door.place("c"):
                pass
        # a post dropped while it waits gives its place back and is passed over
        posts.tasks["a1"].cancel()
        await asyncio.sleep(0)
        assert door.held() == {"a": 1, "b": 1}
        await posts.arrive("c", "c0")
        await posts.release_in_turn()
        assert posts.seated == ["a0", "b0", "c0"]

    asyncio.run(scenario())
    assert door.held() == {}


def post(api: str, key: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{api}/api/eval/batches",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


class SlowPost:
    """A post whose body comes in two parts: in between, it holds its place at the door
    (authenticated, its body being read)."""

    def __init__(self, url: str, key: str, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        address = urlsplit(url)
        self.connection = http.client.HTTPConnection(
            address.hostname or "127.0.0.1", address.port, timeout=60
        )
        self.connection.putrequest("POST", "/api/eval/batches")
        self.connection.putheader("Authorization", f"Bearer {key}")
        self.connection.putheader("Content-Type", "application/json")
        self.connection.putheader("Content-Length", str(len(data)))
        self.connection.endheaders(data[:1])
        self.rest = data[1:]

    def finish(self) -> None:
        """The rest of the body: the post lines up for its turn."""
        self.connection.send(self.rest)

    def answer(self) -> tuple[int, dict[str, Any]]:
        response = self.connection.getresponse()
        document = json.loads(response.read())
        self.connection.close()
        return response.status, document


@pytest.fixture
def served(app: App) -> Iterator[tuple[str, FairDoor]]:
    """The API on a loopback port, and its door."""
    web = create_api(app.web)
    server = BackgroundServer(web, name="api")
    yield server.start(), web.state.door
    server.stop()


def keys_for(app: App, *clients: str) -> dict[str, str]:
    for client in clients:
        app.billing.add_client(client, 1000)
    return {client: app.billing.new_api_key(client) for client in clients}


def test_a_post_past_the_bounds_is_refused_at_once_with_retry_after(
    app: App, served: tuple[str, FairDoor]
) -> None:
    url, door = served
    keys = keys_for(app, "alpha", "bravo", "charlie")
    app.settings.api_client_backlog = 2
    app.settings.api_backlog = 3
    held = [SlowPost(url, keys["alpha"], {"tasks": tasks(1, f"a{n}-")}) for n in range(2)]
    assert wait_for(lambda: door.held() == {"alpha": 2})
    refused = post(url, keys["alpha"], {"tasks": tasks(1, "a9-")})
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"].isdigit()
    assert refused.json()["ok"] is False and refused.json()["reason"] == "too_many_waiting"
    assert "SAAS_EVAL_API_CLIENT_BACKLOG" in refused.json()["message"]
    held.append(SlowPost(url, keys["bravo"], {"tasks": tasks(1, "b0-")}))  # its own share
    assert wait_for(lambda: door.held() == {"alpha": 2, "bravo": 1})
    full = post(url, keys["charlie"], {"tasks": tasks(1, "c0-")})
    assert full.status_code == 503 and full.json()["reason"] == "door_full"
    assert full.headers["Retry-After"].isdigit()
    for slow in held:
        slow.finish()
    assert [slow.answer()[0] for slow in held] == [201] * 3
    assert sum(app.store.count_batches().values()) == 3  # the refused ones left nothing
    assert door.held() == {}


def test_one_clients_flood_of_posts_does_not_delay_another_clients_post(
    app: App, served: tuple[str, FairDoor]
) -> None:
    """Alpha's 40 posts wait at the door before bravo's one comes; bravo's batch is taken
    in within the first turns (first come, first served would take it in last)."""
    url, door = served
    keys = keys_for(app, "alpha", "bravo")
    flood = [SlowPost(url, keys["alpha"], {"tasks": tasks(1, f"a{n}-")}) for n in range(FLOOD)]
    bravo = SlowPost(url, keys["bravo"], {"tasks": tasks(1, "b-")})
    assert wait_for(lambda: door.held() == {"alpha": FLOOD, "bravo": 1})
    with app.store.transaction():  # the posts seated wait at the store: the rest stay in line
        for slow in flood:
            slow.finish()
        assert wait_for(lambda: door.waiting() == {"alpha": FLOOD - SEATS})
        bravo.finish()
        assert wait_for(lambda: door.waiting() == {"alpha": FLOOD - SEATS, "bravo": 1})
    answers = {f"a{n:02}": slow.answer() for n, slow in enumerate(flood)}
    answers["bravo"] = bravo.answer()
    assert {status for status, _ in answers.values()} == {201}
    recorded = sorted(
        (app.store.get_batch(document["batch_id"]).created_at, name)
        for name, (_, document) in answers.items()
    )
    order = [name for _, name in recorded]
    # seated: SEATS of alpha's, then one turn of alpha's, then bravo's (the posts seated
    # beside it may be recorded first)
    assert order.index("bravo") < 2 * SEATS + 2 < FLOOD, order
