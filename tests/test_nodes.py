"""Nodes and leases on a real PostgreSQL (store/nodes.py, store/pg/nodes.py): a lease is
one node's until it releases it or stops beating; a lapsed lease is taken over; a node id
is one process's; every node is listed with its heartbeat and what it holds; nodes share
the forge's budget instead of multiplying it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun
import psycopg
import pytest
import requests
from conftest import served, settings_on, wait_for
from pgcluster import Cluster

from dropbox_eval.app import build_app
from dropbox_eval.errors import AlreadyRunning
from dropbox_eval.forge.limiter import Limiter
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.nodes import default_node_id, leased
from dropbox_eval.store.pg.engine import PostgresStore
from dropbox_eval.store.pg.nodes import PgNode
from dropbox_eval.workers.heartbeat import Heartbeat

BEATEN = 3.0  # seconds: a lease whose node beats every quarter second (a loaded machine)


@pytest.fixture
def store(pg_cluster: Cluster, tmp_path: Path) -> Iterator[PostgresStore]:
    made = PostgresStore(pg_cluster.fresh_url(), tmp_path / "state")
    yield made
    made.close()


def _node(store: PostgresStore, name: str, lease: float = 30.0) -> PgNode:
    node = store.node(name, lease)
    node.join()
    return node


def test_a_lease_is_one_nodes_until_released(store: PostgresStore) -> None:
    a, b = _node(store, "a"), _node(store, "b")
    assert a.take("drop", "c1/x.json")
    assert a.take("drop", "c1/x.json")  # again: still its own
    assert not b.take("drop", "c1/x.json")
    assert b.take("drop", "c1/y.json")  # another key is free
    assert not a.take("drop", "c1/y.json")
    assert a.take("poll", "c1/y.json")  # the same key of another kind too
    a.release("drop", "c1/x.json")
    assert b.take("drop", "c1/x.json")
    b.release("drop", "c1/x.json")
    a.release("drop", "c1/x.json")  # not its own any more: changes nothing
    assert b.take("drop", "c1/x.json")


def test_many_nodes_racing_for_one_lease_give_it_to_exactly_one(store: PostgresStore) -> None:
    nodes = [_node(store, f"n{i}") for i in range(8)]
    start = threading.Barrier(len(nodes))
    won: list[str] = []

    def race(node: PgNode) -> None:
        start.wait()
        if node.take("deliver", "b-1"):
            won.append(node.node_id)

    threads = [threading.Thread(target=race, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1


def test_a_lapsed_lease_is_taken_over_and_a_beating_one_is_not(store: PostgresStore) -> None:
    a, b = _node(store, "a", BEATEN), _node(store, "b", BEATEN)
    assert a.take("poll", "owner/repo")
    assert a.take("poll", "owner/other")
    stop = threading.Event()

    def beating() -> None:
        while not stop.wait(0.25):
            a.beat()

    beater = threading.Thread(target=beating)
    beater.start()
    try:
        # while a beats, b never gets it however long it tries (two lease periods)
        assert not wait_for(lambda: b.take("poll", "owner/repo"), timeout=2 * BEATEN)
    finally:
        stop.set()
        beater.join()
    assert wait_for(lambda: b.take("poll", "owner/repo"))  # a stopped beating: lapsed
    assert not a.take("poll", "owner/repo")  # and it is b's now
    rows = {row.node_id: row for row in b.nodes()}
    assert rows["a"].state == "lost"
    assert rows["b"].holds == {"poll": 1}


def test_a_node_is_listed_with_its_state_and_what_it_holds(store: PostgresStore) -> None:
    a, b = _node(store, "a"), _node(store, "b")
    a.take("drop", "c1/x.json")
    a.take("poll", "o/r1")
    a.take("poll", "o/r2")
    b.take("deliver", "b-1")
    b.leave()
    rows = {row.node_id: row for row in a.nodes()}
    assert rows["a"].state == "up"
    assert rows["a"].holds == {"drop": 1, "poll": 2}
    assert rows["b"].state == "stopped"
    assert rows["b"].holds == {}  # a clean stop gives every lease back
    assert a.take("deliver", "b-1")
    shown = rows["a"].as_dict()
    assert shown["host"] and shown["pid"] and shown["version"]


def test_a_node_id_beating_on_another_host_is_refused(store: PostgresStore) -> None:
    _node(store, "shared-id")
    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute("UPDATE nodes SET host = 'elsewhere' WHERE node_id = 'shared-id'")
    with pytest.raises(AlreadyRunning, match="running on elsewhere"):
        store.node("shared-id", 30.0).join()


def test_a_node_restarted_after_a_kill_takes_its_own_leases_back_at_once(
    store: PostgresStore,
) -> None:
    """A node's id left beating by a killed process on this host is this node's again,
    and the leases of its last life are dropped: none waits for a lease to lapse."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    first = _node(store, "n")
    assert first.take("drop", "c1/x.json")
    with psycopg.connect(store.url, autocommit=True) as conn:  # as its killed process left it
        conn.execute("UPDATE nodes SET pid = %s WHERE node_id = 'n'", (int(dead.stdout),))
    again = _node(store, "n")
    other = _node(store, "other")
    assert other.take("drop", "c1/x.json")
    assert {row.node_id: row.state for row in again.nodes()} == {"n": "up", "other": "up"}


def test_the_heartbeat_tells_how_many_nodes_share_the_forge(store: PostgresStore) -> None:
    seen: list[int] = []
    errors: list[str] = []
    a = _node(store, "a")
    beat = Heartbeat(a, 30.0, lambda what, _exc: errors.append(what), seen.append)
    beat.tick()
    _node(store, "b")
    beat._next = 0.0  # the next beat is due now
    beat.tick()
    assert seen == [1, 2]
    assert errors == []


def test_nodes_share_the_forge_budget_instead_of_multiplying_it() -> None:
    changes: list[int] = []
    limiter = Limiter(initial=40, ceiling=64, on_change=changes.append)
    limiter.share(2)
    assert (limiter.ceiling, limiter.limit) == (32, 32)
    limiter.share(3)
    assert (limiter.ceiling, limiter.limit) == (21, 21)
    limiter.share(1)  # the others stopped: the whole budget again, reached by learning
    assert (limiter.ceiling, limiter.limit) == (64, 21)
    limiter.share(100)
    assert (limiter.ceiling, limiter.limit) == (1, 1)  # never below the floor
    assert changes == [32, 21, 1]


def test_one_machine_is_one_node_holding_every_lease(tmp_path: Path) -> None:
    node = TinyDBStore(tmp_path / "state").node(default_node_id(tmp_path / "state"), 30.0)
    node.join()
    with leased(node, "drop", "c1/x.json") as mine, leased(node, "drop", "c1/x.json") as too:
        assert mine and too
    assert node.nodes() == []
    assert default_node_id(tmp_path / "state") != default_node_id(tmp_path / "other")


def test_a_pause_on_one_node_pauses_every_node(pg_cluster: Cluster, tmp_path: Path) -> None:
    url = pg_cluster.fresh_url()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}

    def on(node: str, *args: str) -> Any:
        state = {
            "SAAS_EVAL_HOME": str(tmp_path),
            "SAAS_EVAL_STATE_DIR": str(tmp_path / f"state-{node}"),
            "SAAS_EVAL_DATABASE_URL": url,
        }
        done = forkrun.run([*args, "--json"], env | state)
        assert done.returncode in (0, 3), done.stderr  # 3: `status` of a stopped service
        return json.loads(done.stdout)

    assert on("b", "status")["paused"] is False
    assert on("a", "pause")["paused"] is True
    shown = on("b", "status")
    assert (shown["paused"], shown["paused_by"]) == (True, "cli")
    assert not (tmp_path / "state-a" / "paused.json").exists()  # the database holds it
    on("b", "resume")
    assert on("a", "status")["paused"] is False
    audit = on("a", "audit")  # each node's CLI writes the database's audit log
    actions = [entry["action"] for entry in audit]
    assert actions == ["pause", "resume"]


def test_readyz_and_the_page_show_every_node(
    pg_cluster: Cluster, tmp_path: Path, forge: SandboxForge
) -> None:
    settings = settings_on(
        forge,
        tmp_path,
        database_url=pg_cluster.fresh_url(),
        node_id="web-node",
        operator_key="k" * 32,
    )
    app = build_app(settings)
    app.node.join()
    other = app.store.node("other-node", 30.0)
    other.join()
    assert other.take("poll", "o/r")
    other.leave()  # stopped: shown so, holding nothing
    with served(app) as url:
        ready = requests.get(f"{url}/readyz", timeout=30).json()
        rows = {row["node_id"]: row for row in ready["nodes"]}
        assert rows["web-node"]["state"] == "up" and rows["other-node"]["state"] == "stopped"
        session = requests.Session()
        page = session.post(f"{url}/operator/login", data={"key": "k" * 32}, timeout=30)
        assert page.status_code == 200
        assert 'data-node="web-node"' in page.text and 'data-node="other-node"' in page.text
    app.store.close()
