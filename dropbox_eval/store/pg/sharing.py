"""What the nodes sharing one database agree on besides the store's records: the node
registry with its leases (nodes.py) and the flags (flags.py). A mixin of the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import __version__
from .flags import PgFlags
from .nodes import PgNode

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from .connection import Connection


class Sharing:
    """The engine's node and flags, on its pool of reads and single changes."""

    url: str
    _pool: ConnectionPool[Connection]

    def node(self, node_id: str, lease_seconds: float) -> PgNode:
        """This process as a node whose leases and heartbeat live in the database."""
        return PgNode(self._pool, self.url, node_id, lease_seconds, __version__)

    def flags(self) -> PgFlags:
        """Flags as rows: a pause on one node is every node's."""
        return PgFlags(self._pool, self.url)
