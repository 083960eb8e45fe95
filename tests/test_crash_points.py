"""Crash points: `run --once` killed right after the Nth durable write of each multi-file
operation, for every N, then restarted: every drop is filed once with one receipt, every
batch ends and is reported, issues equal tasks, and the money adds up.

The walk stops at the first N that the operation does not reach (the pass ends by itself).

Each walk runs on both engines: TinyDB in the state folder, and PostgreSQL (a fresh schema
of the session's cluster for each world), where one COMMIT is one durable write however
many rows it changes. On PostgreSQL the walks are those whose writes differ between the
engines: `close`, `delivery-schedule` and `retry` are the store's writes only, `emit` is
the report and then one COMMIT (the record and its archiving), and `intake` puts the batch
with its hold in one COMMIT before the receipt, its issue numbers and its end in others.
`archive` is no operation of its own there (emit's COMMIT archives), and the walks of
`cancel` and `expire` are the forge's writes, the same on both engines, between a batch
change and a settlement whose kinds the walks above kill after already: on PostgreSQL
they would double the walk's time (32 more kills).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import ENGINES, Receiver, tasks
from crashworld import TASKS, World, assert_invariants, play

from dropbox_eval.billing.accounts import Billing
from dropbox_eval.ops.statecheck import StateCheck
from dropbox_eval.sandbox import SandboxForge

if TYPE_CHECKING:
    from pgcluster import Cluster

MAX_WRITES = 40  # far above any operation's writes: a walk that reaches it is a bug


def drop(world: World) -> None:
    world.drop()


def drop_with_callback(world: World) -> None:
    world.drop(callback=True)


def lane_closes(world: World) -> None:
    world.close_issues()


def cancel(world: World) -> None:
    world.drop_cancel()


def expire(world: World) -> None:
    world.expire_now()


def nothing(world: World) -> None:
    """A later pass, once a delivery's retry is due."""


# the steps of each scenario, and the first step whose pass can reach the operation
SCENARIOS = {
    "intake": ([drop, lane_closes], 0),
    "close": ([drop, lane_closes], 1),
    "emit": ([drop, lane_closes], 1),
    "archive": ([drop, lane_closes], 1),
    "delivery-schedule": ([drop_with_callback, lane_closes, nothing], 1),
    "cancel": ([drop, cancel], 1),
    "expire": ([drop, expire], 1),
}


OPERATIONS = ["intake", "close", "emit", "archive", "cancel", "expire"]
PG_OPERATIONS = ["intake", "close", "emit"]  # why: the docstring (the tests below: both)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Cluster | None:
    """The engine (parametrized by name): None for TinyDB, else the session's cluster."""
    if request.param == "tinydb":
        return None
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    return cluster


def fresh(database: Cluster | None) -> str | None:
    """A new world's database: a fresh schema's URL on PostgreSQL, None on TinyDB."""
    return None if database is None else database.fresh_url()


def walk(
    tmp_path: Path, operation: str, database: Cluster | None, receiver: Receiver | None = None
) -> int:
    """Kill after write 1, 2, ... of `operation` until a pass survives; each run is checked.
    Returns the number of writes walked."""
    callback = operation == "delivery-schedule"
    for n in range(1, MAX_WRITES + 1):
        with (
            SandboxForge(port=0) as forge,
            World(tmp_path / f"{operation}-{n}", forge, receiver, fresh(database)) as world,
        ):
            if receiver is not None:
                receiver.received.clear()
                receiver.answers[:] = [500]  # the first delivery fails
            world.fund()
            steps, armed_from = SCENARIOS[operation]
            killed = play(world, steps, f"{operation}:{n}", armed_from)
            assert_invariants(world, callback=callback)
        if not killed:
            print(f"{operation}: {n - 1} writes walked")
            return n - 1
        print(world.kills[0])
        assert world.kills and world.kills[0].startswith(f"crash point: {operation} write {n}")
    raise AssertionError(f"{operation} still writing after {MAX_WRITES} writes")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("database", "operation"),
    [("tinydb", op) for op in OPERATIONS] + [("postgres", op) for op in PG_OPERATIONS],
    indirect=["database"],
)
def test_a_kill_after_any_write_of_an_operation_is_recovered(
    tmp_path: Path, operation: str, database: Cluster | None
) -> None:
    writes = walk(tmp_path, operation, database)
    assert writes >= 1  # the operation was reached, and each of its writes was killed after


@pytest.mark.slow
@pytest.mark.parametrize("database", ENGINES, indirect=True)
def test_a_kill_after_any_write_of_a_delivery_failure_is_recovered(
    tmp_path: Path, receiver: Receiver, database: Cluster | None
) -> None:
    assert walk(tmp_path, "delivery-schedule", database, receiver) >= 1


@pytest.mark.parametrize("database", ENGINES, indirect=True)
@pytest.mark.parametrize(
    ("operation", "args", "row"),
    [
        pytest.param("fund", ["clients", "fund", "acme", "5"], "pg:ledger", id="fund"),
        pytest.param(
            "rotate-secret",
            ["clients", "rotate-secret", "acme"],
            "pg:clients",
            id="rotate-secret",
        ),
    ],
)
def test_a_kill_after_the_one_write_of_a_client_change_is_recovered(
    tmp_path: Path,
    forge: SandboxForge,
    operation: str,
    args: list[str],
    row: str,
    database: Cluster | None,
) -> None:
    with World(tmp_path, forge, database_url=fresh(database)) as world:
        world.fund()
        secret = world.store().get_client("acme").webhook_secret  # type: ignore[union-attr]
        assert world.command(*args, crash=f"{operation}:1")  # killed right after its write
        written = "index.json" if database is None else row
        assert world.kills == [f"crash point: {operation} write 1 ({written})"]
        assert not world.command(*args, crash=f"{operation}:2")  # it has no second write
        store = world.store()
        client = store.get_client("acme")
        assert client is not None
        if operation == "fund":
            assert client.balance == 50 + 2 * 5
        else:
            assert client.webhook_secret != secret
        assert sum(e.amount for e in store.ledger("acme")) == client.balance
        assert StateCheck(store, Billing(store, 1), 8).run(repair=False) == []


def _expired(world: World) -> str:
    """One batch of TASKS tasks, run, then ended `expired` by its deadline and reported."""
    world.drop()
    world.run_once()
    world.expire_now()
    world.run_once()
    row = world.batch()
    assert row.status == "expired", row
    return str(row.batch_id)


@pytest.mark.slow
@pytest.mark.parametrize("database", ENGINES, indirect=True)
def test_a_kill_after_any_write_of_a_retry_makes_one_linked_retry(
    tmp_path: Path, database: Cluster | None
) -> None:
    """`retry` killed after its Nth write, a restart, then `retry` again: one retry, linked
    both ways, holding its cost, its issues created once, and nothing for `check`. On
    TinyDB the reservation (the link on the old record) and the new batch are written one
    after the other; on PostgreSQL they are one COMMIT."""
    for n in range(1, MAX_WRITES + 1):
        with (
            SandboxForge(port=0) as forge,
            World(tmp_path / f"retry-{n}", forge, database_url=fresh(database)) as world,
        ):
            world.fund()
            old = _expired(world)
            killed = world.command("retry", old, crash=f"retry:{n}")
            world.run_once()  # the restart: the state check, and any issue still missing
            world.command("retry", old)  # finishes a reserved retry; else already_retried
            world.run_once()
            store = world.store()
            retries = [r for r in store.list_batches() if r.batch_id != old]
            assert len(retries) == 1, (retries, world.kills)
            new = store.get_batch(retries[0].batch_id)
            assert new.retry_of == old and store.get_batch(old).retried_by == new.batch_id
            assert new.status == "running" and new.intake_done, new
            titles = [i["title"] for i in forge.issues(forge.user, new.repo.split("/")[1])]
            assert sorted(titles) == sorted(t["title"] for t in tasks(TASKS)), world.kills
            client = store.get_client("acme")
            assert client is not None and client.held == new.cost == TASKS
            assert StateCheck(store, Billing(store, 1), 8).run(repair=False) == [], world.kills
        if not killed:
            walked = n - 1
            print(f"retry: {walked} writes walked")
            # the reservation and the new batch were each killed after (one COMMIT on PG)
            assert (walked == 1) if database else (walked >= 2)
            return
        assert world.kills[0].startswith(f"crash point: retry write {n}"), world.kills
    raise AssertionError(f"retry still writing after {MAX_WRITES} writes")
