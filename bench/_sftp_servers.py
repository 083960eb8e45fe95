"""The SFTP servers the SFTP benches compare, and an OpenSSH client session that times
batches of commands.

- the built-in endpoint: `dropbox-eval sftp` in a subprocess on a bench home;
- OpenSSH's own: `sshd` (a private config on a loopback port, public-key logins only)
  whose `sftp` subsystem is `/usr/lib/openssh/sftp-server`: the same SSH transport as the
  built-in endpoint, so a ratio compares the SFTP servers. Running `sshd` needs
  /usr/sbin/sshd (the openssh-server package) and, as root, its /run/sshd folder.

Used by bench/sftp.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dropbox_eval.config import load_settings
from dropbox_eval.sftp.keys import KeyStore

SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SSHD = "/usr/sbin/sshd"
PROMPT_DONE = "Remote working directory: "


@dataclass(frozen=True)
class Server:
    """A running SFTP server: where it listens, and its process."""

    port: int
    pid: int

    def cpu_seconds(self) -> float:
        """CPU time of the server and of its children that have ended (sshd's sessions
        and their sftp-server), from /proc."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
        ticks = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at `path` (+ `.pub`)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@contextlib.contextmanager
def builtin_endpoint(home: Path, clients: dict[str, Path]) -> Iterator[Server]:
    """`dropbox-eval sftp` on `home` (clients: name -> key, each key added to that client's
    keys)."""
    keys = KeyStore(load_settings(home=home).state_path)
    for client, key in clients.items():
        keys.add(client, key.with_suffix(".pub").read_text())
    env = {**os.environ, "SAAS_EVAL_HOME": str(home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "dropbox_eval", "sftp", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdout is not None
    port = int(server.stdout.readline().rsplit(":", 1)[-1].strip())
    try:
        yield Server(port, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=20)


@contextlib.contextmanager
def openssh_sshd(workdir: Path, key: Path) -> Iterator[Server]:
    """OpenSSH's sshd on a free loopback port, accepting `key` for the current user, its
    `sftp` subsystem OpenSSH's sftp-server."""
    for program in (SSHD, SFTP_SERVER):
        if not os.path.exists(program):
            raise SystemExit(f"{program} is missing: apt-get install openssh-server")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
    port = _free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {keygen(workdir / 'host_key')}\n"
        f"AuthorizedKeysFile {key.with_suffix('.pub')}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PermitRootLogin prohibit-password\nPidFile none\nSubsystem sftp {SFTP_SERVER}\n"
    )
    server = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL, cwd=workdir
    )
    try:
        _wait_listening(port)
        yield Server(port, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=20)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.02)
    raise RuntimeError(f"sshd did not listen on port {port}")


def client_argv(port: int, key: Path, user: str) -> list[str]:
    """OpenSSH's `sftp` in batch mode (commands on stdin) with only `key`, no prompts."""
    return [
        *("sftp", "-F", "/dev/null", "-o", "StrictHostKeyChecking=no"),
        *("-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes"),
        *("-o", "BatchMode=yes", "-i", str(key), "-P", str(port), "-b", "-"),
        f"{user}@127.0.0.1",
    ]


class TimedSession:
    """One long-lived `sftp -b -` session; `run` times a batch of commands.

    Each batch ends with `pwd`, whose answer the client prints only once every command
    before it has been answered, so the time runs from the write of the commands to that
    line. The session is open (logged in, in `folder`) when the constructor returns.
    """

    def __init__(self, argv: list[str], cwd: Path, folder: str = "") -> None:
        """`folder`: a remote folder to change to first (relative to the login folder)."""
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        self.output: list[str] = []  # what the client printed for the last batch
        self.run(f"cd {folder}\n" if folder else "")

    def run(self, commands: str) -> float:
        """Seconds from writing `commands` until the client has their answers."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        started = time.perf_counter()
        stdin.write(f"{commands}pwd\n")
        stdin.flush()
        self.output = []
        while not (line := stdout.readline()).startswith(PROMPT_DONE):
            if not line:
                raise RuntimeError(f"sftp ended: {self.close()}")
            self.output.append(line)
        return time.perf_counter() - started

    def close(self) -> str:
        """End the session; its stderr."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        err = self.proc.stderr.read()
        self.proc.wait(timeout=30)
        return err.strip()

    def __enter__(self) -> TimedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        err = self.close()
        if self.proc.returncode:
            raise RuntimeError(f"sftp exited {self.proc.returncode}: {err}")
