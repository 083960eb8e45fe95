"""A killed node's lease taken over: two PostgreSQL nodes deliver reports to a loopback
receiver that keeps each first delivery waiting; the node holding the `deliver` lease is
SIGKILLed and the other node's takeover is timed, on the database's clock and on ours.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
from _common import make_tasks
from _forge import ForgeProcess
from _nodeproc import LIMIT, NodeProcess, fund, started
from _pgserver import Cluster
from _receiver import HoldingReceiver
from _service import FUNDS, drop, wait_until


@dataclass
class Takeover:
    """One kill, in seconds: on the database's clock, the kill -> the other node's take
    (`taken`), the lease's time left at the kill and its lapse -> the take; on ours, the
    kill -> the take seen by polling the row every 50 ms, and -> the other node's POST."""

    taken: float
    polled: float
    delivered: float
    left_at_kill: float
    lapse_to_take: float


@dataclass
class LeaseRow:
    """A `deliver` lease as the database has it."""

    node_id: str
    taken_at: datetime
    expires_at: datetime


def lease_row(conn: psycopg.Connection[tuple[object, ...]], batch_id: str) -> LeaseRow | None:
    """The batch's `deliver` lease, or None when nobody holds it."""
    row = conn.execute(
        "SELECT node_id, taken_at, expires_at FROM leases WHERE kind = 'deliver' AND key = %s",
        (batch_id,),
    ).fetchone()
    if row is None:
        return None
    return LeaseRow(str(row[0]), row[1], row[2])  # type: ignore[arg-type]


def takeovers(
    cluster: Cluster, lease: float, repeats: int, **node_settings: object
) -> list[Takeover]:
    """`repeats` kills of the node delivering a report, two PostgreSQL nodes with leases of
    `lease` s (and `node_settings`), on a fresh forge, home and schema."""
    settings = {
        **node_settings,
        "lease_seconds": lease,
        "callback_allow": "127.0.0.1",
        "callback_timeout": 3600,  # the holder waits on the silent receiver until killed
    }
    with (
        ForgeProcess(lane_delay=0.0) as forge,
        HoldingReceiver() as receiver,
        tempfile.TemporaryDirectory(prefix="bench-nodes-") as folder,
    ):
        home = Path(folder)
        url = cluster.fresh_url()
        nodes = [NodeProcess(home, name, forge, url, **settings) for name in "ab"]
        fund(home / "setup", url, ["c1"], FUNDS)
        (home / "inbox" / "c1").mkdir(parents=True)
        holds = random.Random(33)  # kills fall anywhere between two heartbeats
        with started(nodes), psycopg.connect(url, autocommit=True) as conn:
            return [
                one_takeover(conn, home, nodes, receiver, n, lease * (1 + holds.random() / 2))
                for n in range(repeats)
            ]


def one_takeover(
    conn: psycopg.Connection[tuple[object, ...]],
    home: Path,
    nodes: list[NodeProcess],
    receiver: HoldingReceiver,
    index: int,
    hold: float,
) -> Takeover:
    """Drop a batch with a callback, SIGKILL the node whose delivery the receiver holds
    once it has held it `hold` s, and time the other node's takeover; the killed node is
    started again after."""
    path = f"/hook/{index}"
    document = {
        "batch_ref": f"k{index}",
        "tasks": make_tasks(1, f"k{index}-"),
        "callback_url": receiver.url + path,
    }
    drop(home / "inbox" / "c1", f"k{index}.json", document)
    wait_until(lambda: receiver.arrivals(path), LIMIT, 0.01)
    receipt = home / "inbox" / "c1" / "accepted" / f"k{index}.json.receipt.json"
    batch_id = json.loads(receipt.read_text(encoding="utf-8"))["batch_id"]
    held = lease_row(conn, batch_id)
    if held is None:
        raise RuntimeError(f"batch {batch_id}: its delivery is under way but no lease is held")
    holder = next(node for node in nodes if node.node_id == held.node_id)
    other = next(node for node in nodes if node is not holder)
    time.sleep(hold)  # the holder's heartbeat extends the lease meanwhile
    at_kill = conn.execute("SELECT now()").fetchone()
    killed = time.perf_counter()
    holder.kill()
    before = lease_row(conn, batch_id)  # the killed node's row, extended no more
    assert at_kill is not None and before is not None and before.node_id == holder.node_id

    def taken_over() -> LeaseRow | None:
        row = lease_row(conn, batch_id)
        return row if row is not None and row.node_id == other.node_id else None

    wait_until(taken_over, LIMIT, 0.05)
    polled = time.perf_counter() - killed
    after = taken_over()
    if after is None:  # the receiver answers the new holder after 0.5 s: its row stays
        raise RuntimeError(f"batch {batch_id}: the lease was taken over and let go at once")
    wait_until(lambda: len(receiver.arrivals(path)) >= 2, LIMIT, 0.01)
    delivered = receiver.arrivals(path)[1] - killed
    holder.start()
    wait_until(holder.up, LIMIT, 0.05)
    killed_at: datetime = at_kill[0]  # type: ignore[assignment]
    return Takeover(
        taken=(after.taken_at - killed_at).total_seconds(),
        polled=polled,
        delivered=delivered,
        left_at_kill=(before.expires_at - killed_at).total_seconds(),
        lapse_to_take=(after.taken_at - before.expires_at).total_seconds(),
    )
