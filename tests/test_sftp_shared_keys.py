"""SFTP on several nodes (issue 33): two real `dropbox-eval sftp` endpoints, each with a
state folder of its own, on one PostgreSQL database and one inbox, driven by OpenSSH's
`sftp` with `StrictHostKeyChecking=yes`. They show one host key (kept in the database,
made once however many nodes start at once), take the same client keys, and a key added
or revoked through either node's command line counts on the other at its next login,
without a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncssh
import forkrun
import pytest
from conftest import PATIENCE
from pgcluster import Cluster
from sftp_stack import keygen, start_endpoint

from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sftp import sftp_status
from dropbox_eval.store.statefolder import open_sftp_keys

NODES = ("a", "b")


class Node:
    """One node: its own state folder, the shared database and inbox."""

    def __init__(self, home: Path, url: str, forge: SandboxForge, name: str) -> None:
        self.state = home / f"state-{name}"
        self.state.mkdir()
        self.log = home / f"sftp-{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
        self.env = {
            **env,
            "SAAS_EVAL_HOME": str(home),
            "SAAS_EVAL_STATE_DIR": str(self.state),
            "SAAS_EVAL_DATABASE_URL": url,
            "SAAS_EVAL_NODE_ID": f"node-{name}",
            "SAAS_EVAL_GITEA_URL": forge.url,
            "SAAS_EVAL_GITEA_TOKEN": forge.token,
            "SAAS_EVAL_OWNER": forge.user,
        }
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Node:
        self.proc, self.port = start_endpoint(self.state.parent, self.log, self.env)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=PATIENCE)

    def cli(self, *args: str) -> forkrun.Finished:
        done = forkrun.run(list(args), self.env, PATIENCE)
        assert done.returncode == 0, done.stderr
        return done


def sftp(
    node: Node, known_hosts: Path, key: Path, commands: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """OpenSSH `sftp -b -` as acme with only `key`, the host key pinned by `known_hosts`."""
    return subprocess.run(
        [
            "sftp",
            *("-F", "/dev/null", "-o", "StrictHostKeyChecking=yes"),
            *("-o", f"UserKnownHostsFile={known_hosts}", "-o", "IdentitiesOnly=yes"),
            *("-o", "BatchMode=yes", "-i", str(key), "-P", str(node.port)),
            *("-b", "-", "acme@127.0.0.1"),
        ],
        input=commands,
        text=True,
        capture_output=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.fixture
def nodes(tmp_path: Path, forge: SandboxForge, pg_cluster: Cluster) -> Iterator[list[Node]]:
    """Two endpoints started at once (both may make the host key) on one database and one
    inbox, with the client `acme` (no key yet)."""
    url = pg_cluster.fresh_url()
    (tmp_path / "inbox" / "acme").mkdir(parents=True)
    both = [Node(tmp_path, url, forge, name) for name in NODES]
    both[0].cli("clients", "add", "acme")
    try:
        with ThreadPoolExecutor(len(both)) as pool:
            list(pool.map(Node.start, both))
        yield both
    finally:
        for node in both:
            node.stop()


def test_two_nodes_share_the_host_key_and_the_client_keys(
    nodes: list[Node], tmp_path: Path
) -> None:
    a, b = nodes
    # one host key, kept in the database: each state folder holds its public half only
    public = {(n.state / "sftp" / "ssh_host_ed25519_key.pub").read_text() for n in nodes}
    assert len(public) == 1
    assert not any((n.state / "sftp" / "ssh_host_ed25519_key").exists() for n in nodes)
    assert sftp_status(a.state)["host_key"] == sftp_status(b.state)["host_key"]
    lines = [
        json.loads(
            n.cli("sftp", "--known-hosts-line", "127.0.0.1", "--port", str(n.port), "--json").stdout
        )["known_hosts_line"].split()
        for n in nodes
    ]
    assert lines[0][1:] == lines[1][1:]
    known_hosts = tmp_path / "known_hosts"  # one entry, the key pinned for both addresses
    known_hosts.write_text(f"{lines[0][0]},{lines[1][0]} {lines[0][1]} {lines[0][2]}\n")

    # a key added through node b, both endpoints already running, logs into both
    key = keygen(tmp_path / "laptop")
    b.cli("clients", "add-key", "acme", str(key.with_suffix(".pub")))
    for node in nodes:
        (tmp_path / f"via-{node.port}.json").write_text('{"tasks": []}')
        done = sftp(node, known_hosts, key, f"put via-{node.port}.json\n", tmp_path)
        assert done.returncode == 0, done.stderr
    landed = sorted(p.name for p in (tmp_path / "inbox" / "acme").glob("via-*.json"))
    assert landed == sorted(f"via-{n.port}.json" for n in nodes)  # one shared inbox

    # node a lists the key node b added, with the last use of the logins above
    listed = json.loads(a.cli("clients", "keys", "acme", "--json").stdout)
    fingerprint = asyncssh.read_public_key(str(key.with_suffix(".pub"))).get_fingerprint()
    (row,) = [r for r in listed if r["kind"] == "sftp"]
    assert row["key_id"] == fingerprint and row["last_used_at"] is not None

    # revoked through node a: node b refuses it at the next login, without a restart
    a.cli("clients", "revoke-key", "acme", fingerprint)
    for node in (b, a):
        refused = sftp(node, known_hosts, key, "ls\n", tmp_path)
        assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
    assert all(n.proc is not None and n.proc.poll() is None for n in nodes)  # still running


def test_nodes_racing_for_the_first_host_key_all_get_the_one_stored(
    tmp_path: Path, pg_cluster: Cluster
) -> None:
    url = pg_cluster.fresh_url()
    offers = [
        bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh"))
        for _ in range(8)
    ]

    def first_start(number: int) -> bytes:
        kept = open_sftp_keys(tmp_path / f"state-{number}", url)
        try:
            return kept.host_key(lambda: offers[number])
        finally:
            kept.close()

    with ThreadPoolExecutor(len(offers)) as pool:
        got = set(pool.map(first_start, range(len(offers))))
    assert len(got) == 1 and got <= set(offers)


def test_a_state_folder_s_own_host_key_becomes_the_shared_one(
    tmp_path: Path, pg_cluster: Cluster
) -> None:
    # a service moved from files to the database keeps the key its clients pinned
    state = tmp_path / "state"
    own = bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh"))
    files = open_sftp_keys(state)
    assert files.host_key(lambda: own) == own
    url = pg_cluster.fresh_url()
    shared = open_sftp_keys(state, url)
    other = open_sftp_keys(tmp_path / "another-node", url)
    try:
        assert shared.host_key(lambda: b"never offered") == own
        assert other.host_key(lambda: b"never offered either") == own
    finally:
        shared.close()
        other.close()
