"""A running SFTP stack for black-box tests: a real `dropbox-eval sftp` subprocess beside a
real `Service` (inotify watcher, sandbox forge) in a thread, on one tmp home, and the real
clients that talk to it (OpenSSH's `sftp`, paramiko).

Logins meant to fail come from their own loopback address (127.0.0.N), so the failure limit
of one test never locks out another.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from conftest import settings_on, wait_for

from dropbox_eval.app import App, build_app
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.sftp.keys import KeyStore


@dataclass
class Stack:
    """The running endpoint and service, the client keys and where things are."""

    home: Path
    port: int
    app: App
    forge: SandboxForge
    keys: dict[str, Path]
    known_hosts: Path
    log: Path
    pid: int

    def folder(self, client: str) -> Path:
        return self.home / "inbox" / client

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


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
    limit_files: tuple[int, int] | None = None,
    **settings: Any,
) -> Iterator[Stack]:
    """The service and the endpoint on `home`, with the same `settings` (the endpoint reads
    them from its environment); each of `clients` has 0 credits and its own key, and
    `stranger` a key nobody accepts."""
    env = {f"SAAS_EVAL_{name.upper()}": str(value) for name, value in settings.items()}
    with SandboxForge(port=0) as forge:
        app = build_app(settings_on(forge, home, **settings))
        keys = {name: keygen(home / f"key-{name}") for name in (*clients, "stranger")}
        for client in clients:
            # the folder exists before the watcher starts: a folder the first login creates
            # is watched a moment later, and an upload renamed into place within that moment
            # is found by the next rescan only (the tests' quiet period is 600 s)
            (app.settings.inbox_path / client).mkdir(parents=True, exist_ok=True)
            app.billing.add_client(client, 0)
            KeyStore(app.settings.state_path).add(
                client, keys[client].with_suffix(".pub").read_text()
            )
        service = Service(app)
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        assert wait_for(lambda: service.status.get("last_poll_at") is not None, 20)
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
    user: str = "acme",
    key: str = "acme",
    bind: str = "127.0.0.1",
    cwd: Path | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`sftp -b -` with these batch commands (the batch stops at the first failure)."""
    return subprocess.run(
        ["sftp", *ssh_options(stack, key, bind), *extra, "-b", "-", f"{user}@127.0.0.1"],
        input=commands,
        text=True,
        capture_output=True,
        timeout=60,
        cwd=cwd,
    )


def paramiko_client(
    stack: Stack, user: str = "acme", key: str = "acme", bind: str = "127.0.0.1"
) -> paramiko.SFTPClient:
    """An authenticated paramiko SFTP session (its transport is `client.get_channel()...`)."""
    transport = transport_to(stack, bind)
    transport.auth_publickey(user, paramiko.Ed25519Key.from_private_key_file(str(stack.keys[key])))
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


def can_log_in(stack: Stack, user: str = "acme", bind: str = "127.0.0.1") -> bool:
    """Whether `user` can open an SFTP session now (with its own key)."""
    try:
        client = paramiko_client(stack, user=user, key=user, bind=bind)
    except (paramiko.SSHException, EOFError):
        return False
    close(client)
    return True
