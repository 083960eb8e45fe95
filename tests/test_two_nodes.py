"""Two service nodes on one PostgreSQL database and one shared inbox, black box: one node
is SIGKILLed in the middle of drops, openings, polls and deliveries, and what the clients
and the forge see is exact (issue 33's "Done when")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import forkrun
import pytest
from conftest import PATIENCE, read_json, tasks, wait_for
from helpers import drop
from pgcluster import Cluster

from dropbox_eval.billing.accounts import Billing
from dropbox_eval.sandbox import SandboxForge, SimulatedLane
from dropbox_eval.store.pg.engine import PostgresStore

CLIENTS = ("c1", "c2", "c3", "c4")
FUNDED = 200
DROPS = 40
LEASE = "3"  # seconds: a killed node's work is taken over soon after


def _env(home: Path, url: str, forge: SandboxForge, node: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env.update(
        SAAS_EVAL_HOME=str(home),
        SAAS_EVAL_STATE_DIR=str(home / f"state-{node}"),
        SAAS_EVAL_DATABASE_URL=url,
        SAAS_EVAL_NODE_ID=f"node-{node}",
        SAAS_EVAL_LEASE_SECONDS=LEASE,
        SAAS_EVAL_GITEA_URL=forge.url,
        SAAS_EVAL_GITEA_TOKEN=forge.token,
        SAAS_EVAL_OWNER=forge.user,
        SAAS_EVAL_POLL_INTERVAL="0.3",
        SAAS_EVAL_QUIET_PERIOD="0.1",
        SAAS_EVAL_SETTLE_SECONDS="0.2",
        SAAS_EVAL_POLLING="true",  # both nodes look at the shared folder themselves
    )
    return env


class Node:
    """One `dropbox-eval run` process: its log kept in a file."""

    def __init__(self, home: Path, env: dict[str, str], name: str) -> None:
        self.env = env
        self.log = home / f"node-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0  # the "service started" lines the log has once the last start is up

    def start(self) -> None:
        self.starts = self._started_lines() + 1
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dropbox_eval", "run"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=PATIENCE)

    def stop(self) -> int:
        """SIGTERM once the process is set up (it said so, or it ended): one stopped
        while it still imports ends by the signal, having done nothing."""
        proc = self.proc
        if proc is None:
            return 0
        wait_for(lambda: proc.poll() is not None or self._started_lines() >= self.starts)
        if proc.poll() is not None:
            return proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=PATIENCE)
        except subprocess.TimeoutExpired:  # not left running: killed, and said by its code
            proc.kill()
            return proc.wait()

    def _started_lines(self) -> int:
        try:
            return self.log.read_text(errors="replace").count("service started")
        except FileNotFoundError:
            return 0

    def cli(self, *args: str) -> forkrun.Finished:
        return forkrun.run(list(args), self.env, PATIENCE)


@pytest.fixture
def lane(forge: SandboxForge) -> Iterator[SimulatedLane]:
    lane = SimulatedLane(forge.state, delay=0.1, interval=0.05)
    lane.start()
    yield lane
    lane.stop()


def _drops(inbox: Path, numbers: range) -> dict[str, int]:
    """Drop one batch per number, clients in turn; its name -> its task count."""
    dropped = {}
    for n in numbers:
        client = CLIENTS[n % len(CLIENTS)]
        count = 1 + n % 3
        name = f"b{n:02d}.json"
        drop(inbox, name, {"batch_ref": f"r{n}", "tasks": tasks(count, f"n{n}-")}, client)
        dropped[f"{client}/{name}"] = count
    return dropped


@pytest.mark.slow
@pytest.mark.parametrize(
    ("restart", "database_restart"),
    [(False, False), (True, False), (False, True)],
    ids=["killed", "killed-and-restarted", "killed-and-database-restarted"],
)
def test_a_node_killed_mid_run_loses_and_doubles_nothing(
    tmp_path: Path,
    forge: SandboxForge,
    pg_cluster: Cluster,
    lane: SimulatedLane,
    restart: bool,
    database_restart: bool,
) -> None:
    url = pg_cluster.fresh_url()
    store = PostgresStore(url, tmp_path / "setup")
    billing = Billing(store, 1)
    for client in CLIENTS:
        billing.add_client(client, FUNDED)
    forge.set_delay(0.02)  # a real forge takes milliseconds: work is under way at the kill
    inbox = tmp_path / "inbox"
    dropped = _drops(inbox, range(0, 16))
    a = Node(tmp_path, _env(tmp_path, url, forge, "a"), "a")
    b = Node(tmp_path, _env(tmp_path, url, forge, "b"), "b")
    a.start()
    b.start()
    try:
        # both running (a node started while its database is away exits, for systemd's
        # Restart= to start it again) before anything is killed or restarted
        assert wait_for(lambda: {"node-a", "node-b"} <= set(_nodes(b))), b.log.read_text()
        started = time.monotonic()
        for first in range(16, DROPS, 4):  # the rest while both run
            time.sleep(0.5)
            dropped |= _drops(inbox, range(first, first + 4))
            if database_restart and first == 24:  # every connection of both nodes ends
                pg_cluster.restart()
        time.sleep(max(0.0, 6.0 - (time.monotonic() - started)))
        a.kill()  # 6 s in: some drops, openings, polls and deliveries are a's
        if restart:
            a.start()
        outbox = tmp_path / "outbox"
        assert wait_for(lambda: len(list(outbox.glob("*.json"))) == DROPS, 4 * PATIENCE), (
            len(list(outbox.glob("*.json"))),
            b.log.read_text()[-3000:],
        )
        # a report lands in outbox/ before its record says so: the end is every record's
        assert wait_for(lambda: {row.status for row in store.list_batches()} == {"emitted"}), (
            b.log.read_text()[-3000:]
        )
        a_is = "up" if restart else "lost"  # lost: no heartbeat within its lease
        assert wait_for(lambda: _nodes(b)["node-a"]["state"] == a_is), _nodes(b)
        assert _nodes(b)["node-b"]["state"] == "up"
        check = b.cli("check")
    finally:
        stopped = a.stop(), b.stop()  # both, whatever the first says
        assert stopped[0] in (0, -signal.SIGKILL), a.log.read_text()[-3000:]
        assert stopped[1] == 0, b.log.read_text()[-3000:]
    _assert_exact(tmp_path, store, forge, dropped)
    assert check.returncode == 0, check.stdout + check.stderr
    store.close()


def _nodes(node: Node) -> dict[str, dict[str, object]]:
    """Every node as `status --json` on `node` shows it."""
    status = node.cli("status", "--json")
    return {row["node_id"]: row for row in json.loads(status.stdout)["nodes"]}


def _assert_exact(
    home: Path, store: PostgresStore, forge: SandboxForge, dropped: dict[str, int]
) -> None:
    inbox = home / "inbox"
    assert sorted(inbox.glob("*/rejected/*")) == []
    receipts = sorted(inbox.glob("*/accepted/*.receipt.json"))
    assert len(receipts) == DROPS  # one per drop: a file filed twice would be rejected
    batch_of = {}
    for receipt in receipts:
        document = read_json(receipt)
        client = receipt.parent.parent.name
        batch_of[f"{client}/{document['file']}"] = document["batch_id"]
    assert batch_of.keys() == dropped.keys()
    rows = store.list_batches()
    assert sorted(row.batch_id for row in rows) == sorted(batch_of.values())  # one per drop
    assert {row.status for row in rows} == {"emitted"}
    titles: Counter[tuple[str, str]] = Counter()
    for _owner, repo in list(forge.state.repos):
        for issue in forge.issues(forge.user, repo):
            titles[(repo, issue["title"])] += 1
    assert sum(titles.values()) == sum(dropped.values())  # one issue per task
    assert max(titles.values()) == 1
    reports = {path.stem: read_json(path) for path in (home / "outbox").glob("*.json")}
    assert sorted(reports) == sorted(batch_of.values())  # one report per batch
    for name, batch_id in batch_of.items():
        assert reports[batch_id]["counts"]["total"] == dropped[name]
    for client in CLIENTS:
        account = store.get_client(client)
        assert account is not None
        charged = sum(c for n, c in dropped.items() if n.startswith(f"{client}/"))
        assert (account.balance, account.held) == (FUNDED - charged, 0)
        kinds = Counter(entry.kind for entry in store.ledger(client))
        batches = sum(1 for n in dropped if n.startswith(f"{client}/"))
        assert kinds["charge"] == batches  # each batch charged once
