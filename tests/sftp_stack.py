"""A running SFTP stack for black-box tests: a real `dropbox-eval sftp` subprocess beside a
real `Service` (inotify watcher, sandbox forge) in a thread, on one tmp home, and the real
clients that talk to it (OpenSSH's `sftp`, paramiko).

Logins meant to fail come from their own loopback address (127.0.0.N), so the failure limit
of one test never locks out another. A stack shared by many tests (`running_stack(seats=N)`)
gives each test clients of its own (`Stack.own_clients`): their folders, sessions and log
lines are that test's alone, so what one test leaves behind is in no other test's listing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from conftest import settings_on, wait_for

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sftp.keys import KeyStore


@dataclass
class Stack:
    """The running endpoint and service, the client keys and where things are. `acme` and
    `other` are the clients the helpers mean by default: on a view from `own_clients`, the
    test's own (`acme3`, `other3`)."""

    home: Path
    port: int
    app: App
    forge: SandboxForge
    keys: dict[str, Path]
    known_hosts: Path
    log: Path
    pid: int
    acme: str = "acme"
    other: str = "other"
    suffix: str = ""  # of the clients `add_client` adds: the test's number on a view
    seats_taken: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def folder(self, client: str | None = None) -> Path:
        return self.home / "inbox" / (client or self.acme)

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def log_lines(self, client: str | None = None) -> list[str]:
        """The endpoint's log lines about `client` (`acme` by default)."""
        who = f"client={client or self.acme} "
        return [line for line in self.log_text().splitlines() if who in line]

    def add_client(self, name: str, key: str) -> str:
        """A new client, `name` + this stack's suffix, with 0 credits, logging in with the
        key `key` (which `keys` then holds under the client's name too); no folder is made."""
        client = f"{name}{self.suffix}"
        register(self.app, client, self.keys[key])
        self.keys[client] = self.keys[key]
        return client

    def own_clients(self) -> Stack:
        """This stack as the next test sees it: `acme` and `other` are new clients of its
        own, `acme<number>` and `other<number>` (keys "acme" and "other"), in the folders
        that `running_stack(seats=...)` made before the service started."""
        number = next(self.seats_taken)
        view = dataclasses.replace(self, keys=dict(self.keys), suffix=str(number))
        for name in OWN_CLIENTS:
            assert view.folder(f"{name}{number}").is_dir(), "more tests than seats"
        view.acme = view.add_client("acme", "acme")
        view.other = view.add_client("other", "other")
        return view


OWN_CLIENTS = ("acme", "other")
"""The clients each test of a shared stack has of its own (with these names' keys)."""


def register(app: App, client: str, key: Path) -> None:
    """`client` with 0 credits, logging in with the key pair `key`."""
    app.billing.add_client(client, 0)
    with KeyStore(app.settings.state_path, app.settings.database_url) as keys:
        keys.add(client, key.with_suffix(".pub").read_text())


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at `path` (+ `.pub`)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def start_endpoint(
    home: Path, log: Path, env: dict[str, str], limit_files: tuple[int, int] | None = None
) -> tuple[subprocess.Popen[str], int]:
    """`dropbox-eval sftp` on a free loopback port with `env` added; its stderr in `log`.
    `limit_files` starts it under that open-file limit (soft, hard)."""

    def limited() -> None:
        if limit_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit_files)

    proc = subprocess.Popen(
        [sys.executable, "-m", "dropbox_eval", "sftp", "--host", "127.0.0.1", "--port", "0"],
        env={**os.environ, "SAAS_EVAL_HOME": str(home), **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        preexec_fn=limited,  # only setrlimit, between fork and exec
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("sftp endpoint listening on 127.0.0.1:"), first
    assert proc.stdout.readline().startswith("host key fingerprint: SHA256:")
    return proc, int(first.rsplit(":", 1)[1])


@contextlib.contextmanager
def running_stack(
    home: Path,
    clients: tuple[str, ...],
    *,
    seats: int = 0,
    limit_files: tuple[int, int] | None = None,
    **settings: Any,
) -> Iterator[Stack]:
    """The service and the endpoint on `home`, with the same `settings` (the endpoint reads
    them from its environment); each of `clients` has 0 credits and its own key, and
    `stranger` a key nobody accepts. `seats`: how many tests share the stack, each with
    clients of its own (`Stack.own_clients()`, once per test)."""
    env = {f"SAAS_EVAL_{name.upper()}": str(value) for name, value in settings.items()}
    with SandboxForge(port=0) as forge:
        app = build_app(settings_on(forge, home, **settings))
        names = dict.fromkeys((*clients, *OWN_CLIENTS, "stranger"))
        keys = {name: keygen(home / f"key-{name}") for name in names}
        # every client's folder exists before the watcher starts: a folder the first login
        # creates is watched a moment later, and an upload renamed into place within that
        # moment is found by the next rescan only (the tests' quiet period is 600 s)
        own = [f"{name}{number}" for number in range(1, seats + 1) for name in OWN_CLIENTS]
        for folder in (*clients, *own):
            (app.settings.inbox_path / folder).mkdir(parents=True, exist_ok=True)
        for client in clients:
            register(app, client, keys[client])
        service = service_for(app)
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        assert wait_for(lambda: service.status.get("last_poll_at") is not None)
        log = home / "sftp.log"
        proc, port = start_endpoint(home, log, env, limit_files)
        host_key = (home / "state" / "sftp" / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts = home / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
        try:
            yield Stack(home, port, app, forge, keys, known_hosts, log, proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
            service.stop()
            thread.join(timeout=20)


def ssh_options(stack: Stack, key: str, bind: str = "127.0.0.1") -> list[str]:
    """OpenSSH options: only this key, the pinned host key, no prompts, a source address."""
    return [
        *("-F", "/dev/null", "-o", "StrictHostKeyChecking=yes"),
        *("-o", f"UserKnownHostsFile={stack.known_hosts}", "-o", "IdentitiesOnly=yes"),
        *("-o", "BatchMode=yes", "-o", f"BindAddress={bind}"),
        *("-i", str(stack.keys[key]), "-P", str(stack.port)),
    ]


def sftp(
    stack: Stack,
    commands: str,
    *,
    user: str | None = None,
    key: str = "acme",
    bind: str = "127.0.0.1",
    cwd: Path | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`sftp -b -` with these batch commands (the batch stops at the first failure), as
    `user` (the stack's `acme` by default)."""
    login = f"{user or stack.acme}@127.0.0.1"
    return subprocess.run(
        ["sftp", *ssh_options(stack, key, bind), *extra, "-b", "-", login],
        input=commands,
        text=True,
        capture_output=True,
        timeout=60,
        cwd=cwd,
    )


def paramiko_client(
    stack: Stack, user: str | None = None, key: str = "acme", bind: str = "127.0.0.1"
) -> paramiko.SFTPClient:
    """An authenticated paramiko SFTP session (its transport is `client.get_channel()...`),
    as `user` (the stack's `acme` by default)."""
    transport = transport_to(stack, bind)
    private = paramiko.Ed25519Key.from_private_key_file(str(stack.keys[key]))
    transport.auth_publickey(user or stack.acme, private)
    client = transport.open_sftp_client()
    assert client is not None
    return client


def close(client: paramiko.SFTPClient) -> None:
    """Close the SFTP session and its SSH connection (SFTPClient.close keeps the latter)."""
    transport = client.get_channel().get_transport()  # type: ignore[union-attr]
    client.close()
    transport.close()


def transport_to(stack: Stack, bind: str) -> paramiko.Transport:
    """A started (not yet authenticated) SSH transport from the source address `bind`."""
    sock = socket.create_connection(("127.0.0.1", stack.port), timeout=10, source_address=(bind, 0))
    transport = paramiko.Transport(sock)
    transport.start_client(timeout=10)
    return transport


def can_log_in(stack: Stack, user: str | None = None, bind: str = "127.0.0.1") -> bool:
    """Whether `user` (the stack's `acme` by default) can open an SFTP session now (with
    its own key)."""
    user = user or stack.acme
    try:
        client = paramiko_client(stack, user=user, key=user, bind=bind)
    except (paramiko.SSHException, EOFError):
        return False
    close(client)
    return True
