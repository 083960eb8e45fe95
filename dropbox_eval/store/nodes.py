"""Service nodes and their leases: how nodes sharing one store agree who does a piece of
work (README "Running two nodes").

A lease names one piece of work by kind and key: a dropped file (`drop`, its path under
the inbox), a repo's poll (`poll`, the repo case-folded) or a batch's delivery (`deliver`,
the batch id). A node takes a lease before the work and releases it after; the node's
heartbeat extends every lease it holds, so a lease lapses only when its node stops beating
(killed, cut off, or stuck), and another node may then take it over. A batch's opening is
claimed by the store's issue claim (`Store.claim_issues`), which ends with its holder.

On one machine (the TinyDB engine) there is one node, and every lease is its own:
`SoloNode`. The PostgreSQL engine keeps nodes and leases as rows (store/pg/nodes.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Literal, Protocol

LeaseKind = Literal["drop", "poll", "deliver"]
LEASE_KINDS: tuple[LeaseKind, ...] = ("drop", "poll", "deliver")


@dataclass(frozen=True)
class NodeRow:
    """One node as the store knows it: `state` is `up` (beating), `lost` (no heartbeat
    within its lease: killed or cut off; its leases are free to take) or `stopped`."""

    node_id: str
    host: str
    pid: int
    version: str
    started_at: str
    heartbeat_at: str
    heartbeat_age: float  # seconds, by the store's clock
    state: str
    holds: dict[str, int] = field(default_factory=dict)  # live leases by kind

    def as_dict(self) -> dict[str, object]:
        """The row for `status --json`, `/readyz` and the page."""
        return {
            "node_id": self.node_id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "heartbeat_age": round(self.heartbeat_age, 1),
            "state": self.state,
            "holds": dict(self.holds),
        }


class Node(Protocol):
    """This process as one node among those sharing the store."""

    @property
    def node_id(self) -> str:
        """The node's id (SAAS_EVAL_NODE_ID, else host and state folder)."""
        ...

    def join(self) -> None:
        """Register as running (the service's start); AlreadyRunning when a live node
        elsewhere has the same id. Leases left by this node's last life are dropped."""
        ...

    def take(self, kind: LeaseKind, key: str) -> bool:
        """Take (or keep) the lease on `key`; False while another live node holds it."""
        ...

    def release(self, kind: LeaseKind, key: str) -> None:
        """Give the lease back (the work is done or left for later)."""
        ...

    def beat(self) -> None:
        """The heartbeat: this node is alive, and every lease it holds is extended."""
        ...

    def leave(self) -> None:
        """A clean stop: every lease released, the node marked stopped."""
        ...

    def nodes(self) -> list[NodeRow]:
        """Every node known to the store (none on a single machine)."""
        ...


class SoloNode:
    """The only node on its store: every lease is its own."""

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id

    @property
    def node_id(self) -> str:
        """The node's id."""
        return self._node_id

    def join(self) -> None:
        """The state folder's lock already makes this node the only one."""

    def take(self, kind: LeaseKind, key: str) -> bool:
        """Always this node's."""
        return True

    def release(self, kind: LeaseKind, key: str) -> None:
        """Nothing is kept."""

    def beat(self) -> None:
        """Nothing to extend."""

    def leave(self) -> None:
        """Nothing to release."""

    def nodes(self) -> list[NodeRow]:
        """A single machine lists no nodes (its status file says what runs)."""
        return []


@contextlib.contextmanager
def leased(node: Node, kind: LeaseKind, key: str) -> Iterator[bool]:
    """Whether this node holds the lease for the block; released when it ends."""
    if not node.take(kind, key):
        yield False
        return
    try:
        yield True
    finally:
        node.release(kind, key)


def default_node_id(state_dir: Path) -> str:
    """The host's name and a short hash of the state folder: two nodes on one host (each
    with its own state folder) differ, and a node keeps its id across restarts."""
    folder = sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{folder}"


def this_process() -> tuple[str, int]:
    """The host and pid a node row records."""
    return socket.gethostname(), os.getpid()


def process_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True
