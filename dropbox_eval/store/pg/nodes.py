"""Nodes and leases on PostgreSQL (store/nodes.py says what they mean; 0003_nodes.sql).

A lease is a row per (kind, key). Taking it locks the row with `FOR UPDATE SKIP LOCKED`:
a node that finds the row locked by another node's take moves on at once, and one that
finds it held by a live node (not expired) leaves it; an expired row is taken over, and
said so in the log. Every time is the database's `now()`, so the nodes' clocks never
have to agree.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...errors import AlreadyRunning
from ..nodes import LeaseKind, NodeRow, process_alive, this_process
from .connection import Connection, database_errors

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger("dropbox_eval")

_LOCK_ROW = """SELECT node_id, expires_at < now() AS lapsed,
    extract(epoch FROM now() - expires_at) AS lapsed_for
    FROM leases WHERE kind = %s AND key = %s FOR UPDATE SKIP LOCKED"""
_EXISTS = "SELECT 1 FROM leases WHERE kind = %s AND key = %s"
_INSERT = """INSERT INTO leases (kind, key, node_id, taken_at, expires_at)
    VALUES (%s, %s, %s, now(), now() + make_interval(secs => %s))
    ON CONFLICT (kind, key) DO NOTHING RETURNING node_id"""
_RETAKE = """UPDATE leases SET node_id = %s, taken_at = now(),
    expires_at = now() + make_interval(secs => %s) WHERE kind = %s AND key = %s"""
_NODES = """SELECT n.node_id, n.host, n.pid, n.version, n.lease_seconds, n.stopped_at,
    to_char(n.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS started,
    to_char(n.heartbeat_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS beat,
    extract(epoch FROM now() - n.heartbeat_at) AS age,
    (SELECT coalesce(jsonb_object_agg(kind, held), '{}'::jsonb) FROM (
        SELECT kind, count(*) AS held FROM leases l
        WHERE l.node_id = n.node_id AND l.expires_at > now() GROUP BY kind) AS h) AS holds
    FROM nodes n ORDER BY n.node_id"""


class PgNode:
    """This process as node `node_id` on the database behind `pool`."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        url: str,
        node_id: str,
        lease_seconds: float,
        version: str,
    ) -> None:
        self._pool = pool
        self._url = url
        self._node_id = node_id
        self._lease = lease_seconds
        self._version = version

    @property
    def node_id(self) -> str:
        """The node's id."""
        return self._node_id

    def join(self) -> None:
        """Register this node; AlreadyRunning when the same id beats elsewhere."""
        host, pid = this_process()
        with database_errors(self._url), self._pool.connection() as conn, conn.transaction():
            row = conn.execute(
                """SELECT host, pid, stopped_at IS NULL
                   AND heartbeat_at > now() - make_interval(secs => lease_seconds) AS live
                   FROM nodes WHERE node_id = %s FOR UPDATE""",
                (self._node_id,),
            ).fetchone()
            if row is not None and row["live"] and _elsewhere(row["host"], row["pid"]):
                raise AlreadyRunning(
                    f"node {self._node_id} is running on {row['host']} (pid {row['pid']}); "
                    "give this node its own SAAS_EVAL_NODE_ID or state folder"
                )
            conn.execute(
                """INSERT INTO nodes VALUES (%s, %s, %s, %s, %s, now(), now(), NULL)
                   ON CONFLICT (node_id) DO UPDATE SET host = excluded.host,
                   pid = excluded.pid, version = excluded.version,
                   lease_seconds = excluded.lease_seconds, started_at = now(),
                   heartbeat_at = now(), stopped_at = NULL""",
                (self._node_id, host, pid, self._version, self._lease),
            )
            # whatever this node held in its last life is not under way any more
            conn.execute("DELETE FROM leases WHERE node_id = %s", (self._node_id,))

    def take(self, kind: LeaseKind, key: str) -> bool:
        """Take the lease unless another live node holds it (or is taking it now)."""
        with database_errors(self._url), self._pool.connection() as conn, conn.transaction():
            row = conn.execute(_LOCK_ROW, (kind, key)).fetchone()
            if row is None:
                if conn.execute(_EXISTS, (kind, key)).fetchone() is not None:
                    return False  # locked by another node's take at this moment
                inserted = conn.execute(_INSERT, (kind, key, self._node_id, self._lease))
                return inserted.fetchone() is not None
            if row["node_id"] != self._node_id and not row["lapsed"]:
                return False
            if row["node_id"] != self._node_id:
                log.warning(
                    "took over the %s lease on %s from node %s (lapsed %.1f s ago)",
                    kind,
                    key,
                    row["node_id"],
                    float(row["lapsed_for"]),
                )
            conn.execute(_RETAKE, (self._node_id, self._lease, kind, key))
            return True

    def release(self, kind: LeaseKind, key: str) -> None:
        """Give the lease back, if this node still holds it."""
        with database_errors(self._url), self._pool.connection() as conn:
            conn.execute(
                "DELETE FROM leases WHERE kind = %s AND key = %s AND node_id = %s",
                (kind, key, self._node_id),
            )

    def beat(self) -> None:
        """This node is alive; each lease it holds runs for another lease period."""
        with database_errors(self._url), self._pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE nodes SET heartbeat_at = now(), stopped_at = NULL WHERE node_id = %s",
                (self._node_id,),
            )
            conn.execute(
                """UPDATE leases SET expires_at = now() + make_interval(secs => %s)
                   WHERE node_id = %s""",
                (self._lease, self._node_id),
            )

    def leave(self) -> None:
        """Release every lease and mark the node stopped."""
        with database_errors(self._url), self._pool.connection() as conn, conn.transaction():
            conn.execute("DELETE FROM leases WHERE node_id = %s", (self._node_id,))
            conn.execute("UPDATE nodes SET stopped_at = now() WHERE node_id = %s", (self._node_id,))

    def nodes(self) -> list[NodeRow]:
        """Every node the database knows, with its live leases by kind."""
        with database_errors(self._url), self._pool.connection() as conn:
            rows = conn.execute(_NODES).fetchall()
        return [_node_row(row) for row in rows]


def _elsewhere(host: str, pid: int) -> bool:
    """Whether a node row that still beats belongs to a live process other than this one:
    on another host, or alive on this one (a killed predecessor here is not)."""
    here, me = this_process()
    if host != here:
        return True
    return pid != me and process_alive(pid)


def _node_row(row: dict[str, object]) -> NodeRow:
    age = float(row["age"])  # type: ignore[arg-type]
    if row["stopped_at"] is not None:
        state = "stopped"
    else:
        state = "up" if age <= float(row["lease_seconds"]) else "lost"  # type: ignore[arg-type]
    holds = row["holds"]
    return NodeRow(
        node_id=str(row["node_id"]),
        host=str(row["host"]),
        pid=int(row["pid"]),  # type: ignore[call-overload]
        version=str(row["version"]),
        started_at=str(row["started"]),
        heartbeat_at=str(row["beat"]),
        heartbeat_age=age,
        state=state,
        holds={str(k): int(v) for k, v in holds.items()} if isinstance(holds, dict) else {},
    )
