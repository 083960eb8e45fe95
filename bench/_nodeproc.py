"""One service node as an operator runs it: `python -m dropbox_eval run` in a process of
its own, with its own state folder, on a shared home (inbox and outbox), against a forge,
and on TinyDB or on a PostgreSQL database shared with other nodes.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from _service import wait_until

from dropbox_eval.billing.accounts import Billing
from dropbox_eval.store.servicestate import running_status
from dropbox_eval.store.statefolder import open_store

STOP_WAIT = 120.0
LIMIT = 600.0  # seconds any one wait may take on a loaded machine


class ForgeAddress(Protocol):
    """Where a node finds its forge."""

    url: str
    token: str
    user: str


def fund(state_dir: Path, url: str | None, clients: list[str], credits: int) -> None:
    """Create the clients with `credits` each in the store the nodes will share (TinyDB
    in `state_dir` when `url` is None), and close it before any node opens it."""
    store = open_store(state_dir, database_url=url)
    try:
        billing = Billing(store, 1)
        for client in clients:
            billing.add_client(client, credits)
    finally:
        store.close()


class NodeProcess:
    """One `dropbox-eval run` process; its log (stderr) kept in `home/node-<name>.log`."""

    def __init__(
        self,
        home: Path,
        name: str,
        forge: ForgeAddress,
        url: str | None,
        **settings: object,
    ) -> None:
        """`settings` are SAAS_EVAL_* values by field name (`lease_seconds=3`); the node's
        id is `node-<name>` and its state folder `home/state-<name>`."""
        self.name = name
        self.node_id = f"node-{name}"
        self.state_dir = home / f"state-{name}"
        self.log = home / f"node-{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAAS_EVAL_", "SANDBOX_"))}
        values: dict[str, object] = {
            "home": home,
            "state_dir": self.state_dir,
            "node_id": self.node_id,
            "gitea_url": forge.url,
            "gitea_token": forge.token,
            "owner": forge.user,
            **settings,
        }
        if url is not None:
            values["database_url"] = url
        env.update({f"SAAS_EVAL_{k.upper()}": str(v) for k, v in values.items()})
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (it runs until `stop` or `kill`)."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dropbox_eval", "run"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def up(self) -> bool:
        """Whether the service runs and has finished its first poll (RuntimeError once the
        process has ended)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"node {self.name} ended: {self.tail()}")
        status = running_status(self.state_dir)
        return bool(status and status.get("last_poll_at"))

    def kill(self) -> None:
        """SIGKILL: no clean stop, its leases are left to lapse."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_WAIT)

    def stop(self) -> None:
        """SIGTERM and wait (a clean stop releases the node's leases); RuntimeError when it
        exits with an error."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"node {self.name} did not stop: {self.tail()}") from None
        if code != 0:
            raise RuntimeError(f"node {self.name} exited {code}: {self.tail()}")

    def tail(self, chars: int = 2000) -> str:
        """The end of the node's log."""
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


@contextlib.contextmanager
def started(nodes: list[NodeProcess]) -> Iterator[list[NodeProcess]]:
    """The nodes started and up (their first poll done); stopped cleanly after (an error
    of a stop is raised once every node has been stopped)."""
    for node in nodes:
        node.start()
    try:
        wait_until(lambda: all(node.up() for node in nodes), LIMIT, 0.05)
        yield nodes
    finally:
        failures = []
        for node in nodes:
            try:
                node.stop()
            except RuntimeError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
