"""The built-in SFTP endpoint (issue 14) with real clients: OpenSSH's sftp/scp and paramiko.

One endpoint runs as a real `dropbox-eval sftp` subprocess and one real `Service` (inotify
watcher, sandbox forge) runs in a thread, both on the same tmp home. The service's quiet
period is 600 s: an upload becomes a batch within seconds only because the endpoint renames
it into place on close, which the watcher reads at once. Logins that are meant to fail come
from their own loopback address (127.0.0.N), so the per-address failure limit of one test
never locks out another.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest
from conftest import read_json, settings_on, tasks, wait_for

from dropbox_eval.app import App, build_app
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.sftp import sftp_status
from dropbox_eval.sftp.keys import KeyStore

MAX_BYTES = 256 * 1024
MAX_FAILURES = 3
MAX_SESSIONS = 2


@dataclass
class Stack:
    """The running endpoint and service, the client keys and where things are."""

    home: Path
    port: int
    app: App
    keys: dict[str, Path]
    known_hosts: Path
    log: Path

    def folder(self, client: str) -> Path:
        return self.home / "inbox" / client

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def _keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def _start_endpoint(home: Path, log: Path) -> tuple[subprocess.Popen[str], int]:
    env = {
        **os.environ,
        "SAAS_EVAL_HOME": str(home),
        "SAAS_EVAL_MAX_FILE_BYTES": str(MAX_BYTES),
        "SAAS_EVAL_SFTP_MAX_SESSIONS": str(MAX_SESSIONS),
        "SAAS_EVAL_SFTP_MAX_AUTH_FAILURES": str(MAX_FAILURES),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dropbox_eval", "sftp", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("sftp endpoint listening on 127.0.0.1:"), first
    assert proc.stdout.readline().startswith("host key fingerprint: SHA256:")
    return proc, int(first.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("sftp-home")
    with SandboxForge(port=0) as forge:
        settings = settings_on(
            forge,
            home,
            quiet_period=600.0,
            rescan_interval=600.0,
            poll_interval=600.0,
            task_price=0,
            max_file_bytes=MAX_BYTES,
        )
        app = build_app(settings)
        keys = {name: _keygen(home / f"key-{name}") for name in ("acme", "other", "stranger")}
        for client in ("acme", "other"):
            app.billing.add_client(client, 0)
            KeyStore(settings.state_path).add(client, keys[client].with_suffix(".pub").read_text())
        service = Service(app)
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        assert wait_for(lambda: service.status.get("last_poll_at") is not None, 20)
        log = home / "sftp.log"
        proc, port = _start_endpoint(home, log)
        host_key = (home / "state" / "sftp" / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts = home / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
        try:
            yield Stack(home, port, app, keys, known_hosts, log)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
            service.stop()
            thread.join(timeout=20)


# -- clients --------------------------------------------------------------------------------


def ssh_options(stack: Stack, key: str, bind: str = "127.0.0.1") -> list[str]:
    """OpenSSH options: only this key, the pinned host key, no prompts, a source address."""
    return [
        "-F",
        "/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={stack.known_hosts}",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"BindAddress={bind}",
        "-i",
        str(stack.keys[key]),
        "-P",
        str(stack.port),
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
    transport = _transport(stack, bind)
    transport.auth_publickey(user, paramiko.Ed25519Key.from_private_key_file(str(stack.keys[key])))
    client = transport.open_sftp_client()
    assert client is not None
    return client


def _close(client: paramiko.SFTPClient) -> None:
    """Close the SFTP session and its SSH connection (SFTPClient.close keeps the latter)."""
    transport = client.get_channel().get_transport()  # type: ignore[union-attr]
    client.close()
    transport.close()


def _transport(stack: Stack, bind: str) -> paramiko.Transport:
    sock = socket.create_connection(("127.0.0.1", stack.port), timeout=10, source_address=(bind, 0))
    transport = paramiko.Transport(sock)
    transport.start_client(timeout=10)
    return transport


def batch_json(name: str, count: int = 1, client: str = "acme") -> bytes:
    return json.dumps(
        {
            "client_id": client,
            "batch_ref": name.replace(".", "-"),
            "tasks": tasks(count, prefix=name.split(".")[0]),
        }
    ).encode()


def receipt(stack: Stack, name: str, client: str = "acme") -> dict[str, Any] | None:
    path = stack.folder(client) / "accepted" / f"{name}.receipt.json"
    return read_json(path) if path.exists() else None


def leftovers(stack: Stack, client: str = "acme") -> list[str]:
    folder = stack.folder(client)
    return (
        sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
        if folder.is_dir()
        else []
    )


# -- uploads ----------------------------------------------------------------------------------


def test_put_wait_and_get_receipt_in_one_session(stack: Stack, tmp_path: Path) -> None:
    client = paramiko_client(stack)
    try:
        with client.open("one.json", "wb") as handle:
            handle.write(batch_json("one.json", 3))

        def present() -> bool:
            try:
                client.stat("accepted/one.json.receipt.json")
            except FileNotFoundError:
                return False
            return True

        assert wait_for(present, 20), "no receipt although the quiet period is 600 s"
        client.get("accepted/one.json.receipt.json", str(tmp_path / "r.json"))
    finally:
        _close(client)
    got = read_json(tmp_path / "r.json")
    assert got["ok"] is True and got["file"] == "one.json"
    record = stack.app.store.get_batch(got["batch_id"])
    assert record is not None and record.total == 3
    assert wait_for(lambda: f"file=one.json batch={got['batch_id']}" in stack.log_text(), 10)
    line = next(x for x in stack.log_text().splitlines() if "file=one.json bytes=" in x)
    assert "client=acme key=SHA256:" in line and "from=127.0.0.1" in line
    assert "outcome=completed" in line and leftovers(stack) == []


def test_openssh_sftp_and_scp_uploads_become_batches(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "put.json").write_bytes(batch_json("put.json"))
    (tmp_path / "scp.json").write_bytes(batch_json("scp.json"))
    done = sftp(stack, "put put.json\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    copied = subprocess.run(
        ["scp", *ssh_options(stack, "acme"), str(tmp_path / "scp.json"), "acme@127.0.0.1:scp.json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert copied.returncode == 0, copied.stderr
    assert wait_for(lambda: bool(receipt(stack, "put.json") and receipt(stack, "scp.json")), 20)
    fetched = sftp(stack, "get accepted/put.json.receipt.json got.json\n", cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    assert read_json(tmp_path / "got.json") == receipt(stack, "put.json")


def test_winscp_filepart_then_rename_gives_one_batch(stack: Stack) -> None:
    client = paramiko_client(stack)
    try:
        with client.open("win.json.filepart", "wb") as handle:
            handle.write(batch_json("win.json"))
        assert (stack.folder("acme") / "win.json.filepart").exists()  # not a candidate
        client.rename("win.json.filepart", "win.json")  # SSH_FXP_RENAME, as WinSCP sends
    finally:
        _close(client)
    assert wait_for(lambda: receipt(stack, "win.json") is not None, 20)
    rejected = stack.folder("acme") / "rejected"
    assert not rejected.exists() or not any(p.name.startswith("win") for p in rejected.iterdir())
    accepted = [
        p.name for p in (stack.folder("acme") / "accepted").iterdir() if p.name.startswith("win")
    ]
    assert sorted(accepted) == ["win.json", "win.json.receipt.json"]


def test_killed_client_mid_upload_leaves_no_batch(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "slow.json").write_bytes(b" " * 200_000 + batch_json("slow.json"))
    proc = subprocess.Popen(
        ["sftp", *ssh_options(stack, "acme"), "-B", "1024", "-l", "8", "-b", "-", "acme@127.0.0.1"],
        stdin=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "err").open("w"),
    )
    assert proc.stdin is not None
    proc.stdin.write("put slow.json\n")
    proc.stdin.close()
    assert wait_for(lambda: any(".slow.json.part" in n for n in leftovers(stack)), 20), (
        tmp_path / "err"
    ).read_text()
    proc.kill()
    proc.wait()
    # paramiko: the connection closes, or only the SFTP channel sends EOF, with the upload open
    for name, end in (("lost.json", "connection"), ("eof.json", "eof")):
        client = paramiko_client(stack)
        handle = client.open(name, "wb")
        handle.write(batch_json(name))
        handle.flush()
        assert len(leftovers(stack)) == 1
        if end == "eof":
            client.get_channel().shutdown_write()  # type: ignore[union-attr]
            assert wait_for(lambda: leftovers(stack) == [], 20), leftovers(stack)
        _close(client)
    assert wait_for(lambda: leftovers(stack) == [], 20), leftovers(stack)
    assert wait_for(lambda: stack.log_text().count("outcome=dropped") >= 3, 10)
    names = ("slow.json", "lost.json", "eof.json")
    for name in names:
        assert not (stack.folder("acme") / name).exists()
        assert receipt(stack, name) is None
        assert not (stack.folder("acme") / "rejected" / f"{name}.error.json").exists()
    assert not any(b.batch_ref in ("slow-json", "lost-json", "eof-json") for b in _batches(stack))


def _batches(stack: Stack) -> list[Any]:
    return [stack.app.store.get_batch(row["batch_id"]) for row in stack.app.store.list_batches()]


def test_file_over_the_limit_fails_during_the_upload(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "big.json").write_bytes(b" " * (MAX_BYTES + 1) + batch_json("big.json"))
    done = sftp(stack, "put big.json\n", cwd=tmp_path)
    assert done.returncode != 0
    assert "Failure" in done.stderr or "too large" in done.stderr, done.stderr
    assert (
        "file=big.json" in stack.log_text()
        and "outcome=refused (file too large" in stack.log_text()
    )
    assert leftovers(stack) == [] and not (stack.folder("acme") / "big.json").exists()
    client = paramiko_client(stack)  # paramiko shows the server's message
    try:
        with pytest.raises(OSError, match="too large"), client.open("big2.json", "wb") as handle:
            handle.write(b" " * (MAX_BYTES + 1))
    finally:
        _close(client)
    assert leftovers(stack) == [] and not (stack.folder("acme") / "big2.json").exists()


def test_put_replaces_a_pending_file_and_resumes_are_refused(stack: Stack, tmp_path: Path) -> None:
    folder = stack.folder("acme")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "again.json").write_text("{ not yet")  # pending: the quiet period is 600 s
    (folder / "resume.json.part").write_bytes(b"x" * 10)
    (tmp_path / "again.json").write_bytes(batch_json("again.json"))
    (tmp_path / "resume.json").write_bytes(b"x" * 20)
    copied = subprocess.run(
        [
            "scp",
            *ssh_options(stack, "acme"),
            str(tmp_path / "again.json"),
            "acme@127.0.0.1:again.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # scp opens without FXF_TRUNC and sets the size at the end
    assert copied.returncode == 0, copied.stderr
    assert wait_for(lambda: receipt(stack, "again.json") is not None, 20)
    assert (folder / "accepted" / "again.json").read_bytes() == batch_json("again.json")
    resumed = sftp(stack, "reput resume.json resume.json.part\n", cwd=tmp_path)
    assert resumed.returncode != 0
    assert (folder / "resume.json.part").read_bytes() == b"x" * 10
    client = paramiko_client(stack)
    try:
        with pytest.raises(OSError), client.open("resume.json.part", "a") as handle:
            handle.write(b"more")
        with pytest.raises(OSError, match="resuming"), client.open("hole.json", "wb") as handle:
            handle.seek(100)
            handle.write(b"{}")
    finally:
        _close(client)
    assert (folder / "resume.json.part").read_bytes() == b"x" * 10
    assert not (folder / "hole.json").exists() and leftovers(stack) == []
    (folder / "resume.json.part").unlink()


# -- the jail ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "cd ..",
        "ls ..",
        "get /etc/passwd",
        "get ../../../etc/passwd",
        "ls /etc",
        "get /other/accepted/secret.json.receipt.json",
        "get ../other/accepted/secret.json.receipt.json",
        "get accepted/../../other/accepted/secret.json.receipt.json",
        "symlink accepted/x.json.receipt.json link.json",
        "ln accepted/x.json.receipt.json hard.json",
        "get accepted/leak.json.receipt.json",
        "get pending.json",
        "mkdir sub",
        "put local.json accepted/local.json",
        "put local.json notes.txt",
        "put local.json .sftp-mine.part",
        "put local.json accepted/.x.json.tmp",
        "get accepted/.x.json.receipt.json",
        "rm accepted/x.json.receipt.json",
        "rename accepted/x.json.receipt.json x.json",
    ],
)
def test_jail_refuses(stack: Stack, tmp_path: Path, command: str) -> None:
    acme, other = stack.folder("acme"), stack.folder("other")
    for folder in (acme / "accepted", other / "accepted"):
        folder.mkdir(parents=True, exist_ok=True)
    (other / "accepted" / "secret.json.receipt.json").write_text('{"secret": 1}')
    (acme / "accepted" / "x.json.receipt.json").write_text('{"mine": 1}')
    (acme / "pending.json.part").write_text("{}")
    leak = acme / "accepted" / "leak.json.receipt.json"
    if not leak.is_symlink():
        leak.symlink_to(other / "accepted" / "secret.json.receipt.json")
    (tmp_path / "local.json").write_text("{}")
    done = sftp(stack, f"{command}\n", cwd=tmp_path)
    assert done.returncode != 0, (command, done.stdout, done.stderr)
    assert {p.name for p in tmp_path.iterdir()} == {"local.json"}
    assert (acme / "accepted" / "x.json.receipt.json").read_text() == '{"mine": 1}'
    assert sorted(p.name for p in acme.iterdir()) == ["accepted", "pending.json.part"] + (
        ["rejected"] if (acme / "rejected").exists() else []
    )


def test_symlinked_client_folder_is_refused(stack: Stack, tmp_path: Path) -> None:
    stack.app.billing.add_client("mallory", 0)
    KeyStore(stack.home / "state").add(
        "mallory", stack.keys["acme"].with_suffix(".pub").read_text()
    )
    stack.folder("other").mkdir(parents=True, exist_ok=True)
    (stack.home / "inbox" / "mallory").symlink_to(stack.folder("other"))
    before = sorted(p.name for p in stack.folder("other").iterdir())
    (tmp_path / "m.json").write_bytes(batch_json("m.json"))
    done = sftp(stack, "put m.json\n", user="mallory", cwd=tmp_path)
    assert done.returncode != 0
    assert sorted(p.name for p in stack.folder("other").iterdir()) == before
    assert "refused session: client=mallory" in stack.log_text()


def test_listing_shows_only_regular_files_and_receipts_are_readable(
    stack: Stack, tmp_path: Path
) -> None:
    accepted = stack.folder("acme") / "accepted"
    accepted.mkdir(parents=True, exist_ok=True)
    (accepted / "mine.json.receipt.json").write_text('{"mine": 2}')
    link = accepted / "link.json.receipt.json"
    if not link.is_symlink():
        link.symlink_to("/etc/passwd")
    done = sftp(stack, "ls -1 accepted\nget accepted/mine.json.receipt.json\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "mine.json.receipt.json" in done.stdout and "link.json" not in done.stdout
    assert read_json(tmp_path / "mine.json.receipt.json") == {"mine": 2}


# -- the door ---------------------------------------------------------------------------------


def test_wrong_key_wrong_user_and_passwords_are_refused(stack: Stack, tmp_path: Path) -> None:
    wrong_key = sftp(stack, "ls\n", key="stranger", bind="127.0.0.3")
    assert wrong_key.returncode == 255 and "Permission denied (publickey)" in wrong_key.stderr
    wrong_user = sftp(stack, "ls\n", user="other", key="acme", bind="127.0.0.4")
    assert wrong_user.returncode == 255 and "Permission denied" in wrong_user.stderr
    unknown = sftp(stack, "ls\n", user="../acme", key="acme", bind="127.0.0.4")
    assert unknown.returncode == 255
    for attempt in ("password", "keyboard-interactive"):
        transport = _transport(stack, "127.0.0.5")
        try:
            with pytest.raises(paramiko.BadAuthenticationType) as refused:
                if attempt == "password":
                    transport.auth_password("acme", "hunter2")
                else:
                    transport.auth_interactive_dumb("acme")
            assert refused.value.allowed_types == ["publickey"]
        finally:
            transport.close()
    assert wait_for(lambda: "failed login from 127.0.0.4 as 'other'" in stack.log_text(), 10)
    assert "key SHA256:" in stack.log_text() and "not accepted for user 'acme'" in stack.log_text()


def test_a_reserved_user_name_never_logs_in(stack: Stack) -> None:
    """Issue 19: a key file left for a reserved id (from before ids were reserved) would
    make `inbox/accepted/`, where every top-level drop is filed, someone's SFTP root."""
    keys = stack.home / "state" / "sftp" / "keys"
    acme_key = (keys / "acme.pub").read_text()
    for user, bind in (("accepted", "127.0.0.40"), ("Rejected", "127.0.0.41")):
        (keys / f"{user}.pub").write_text(acme_key)
        refused = sftp(stack, "ls\n", user=user, key="acme", bind=bind)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        with pytest.raises(paramiko.AuthenticationException):
            paramiko_client(stack, user=user, key="acme", bind=bind)
        assert wait_for(lambda u=user: f"login as {u!r} from" in stack.log_text(), 10)
    assert "is reserved" in stack.log_text()
    assert sftp(stack, "ls\n", bind="127.0.0.42").returncode == 0  # acme's key still works


def test_repeated_failures_from_one_address_are_refused_early(stack: Stack) -> None:
    for _ in range(MAX_FAILURES):
        assert sftp(stack, "ls\n", key="stranger", bind="127.0.0.6").returncode == 255
    assert wait_for(lambda: stack.log_text().count("failed login from 127.0.0.6") == 3, 10)
    refused = sftp(stack, "ls\n", key="acme", bind="127.0.0.6")  # even the right key
    assert refused.returncode == 255 and "too many failed logins" in refused.stderr
    assert "refused 127.0.0.6" in stack.log_text()
    assert sftp(stack, "ls\n", key="acme", bind="127.0.0.7").returncode == 0  # others are fine


def test_no_shell_exec_forwarding_or_legacy_scp(stack: Stack, tmp_path: Path) -> None:
    client = paramiko_client(stack)
    transport = client.get_channel().get_transport()  # type: ignore[union-attr]
    assert transport is not None
    try:
        for request in ("exec_command", "invoke_shell"):
            channel = transport.open_session()
            with pytest.raises(paramiko.SSHException):
                if request == "exec_command":
                    channel.exec_command("id")
                else:
                    channel.invoke_shell()
        with pytest.raises(paramiko.ChannelException):
            transport.open_channel("direct-tcpip", ("127.0.0.1", stack.port), ("127.0.0.1", 0))
    finally:
        _close(client)
    (tmp_path / "legacy.json").write_text("{}")
    legacy = subprocess.run(
        [
            "scp",
            "-O",
            *ssh_options(stack, "acme"),
            str(tmp_path / "legacy.json"),
            "acme@127.0.0.1:legacy.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert legacy.returncode != 0 and not (stack.folder("acme") / "legacy.json").exists()


def test_sessions_per_client_are_limited(stack: Stack) -> None:
    open_sessions = [paramiko_client(stack, bind=f"127.0.0.{8 + i}") for i in range(MAX_SESSIONS)]
    try:
        with pytest.raises((paramiko.SSHException, EOFError)):  # refused while negotiating
            paramiko_client(stack, bind="127.0.0.20")
        assert wait_for(lambda: "already 2 sessions (limit 2" in stack.log_text(), 10)
    finally:
        for session in open_sessions:
            _close(session)
    assert wait_for(lambda: _can_log_in(stack), 10)


def _can_log_in(stack: Stack) -> bool:
    try:
        client = paramiko_client(stack, bind="127.0.0.21")
    except (paramiko.SSHException, EOFError):
        return False
    _close(client)
    return True


# -- operator commands ------------------------------------------------------------------------


def _cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dropbox_eval", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
    )


def test_key_commands_and_status(stack: Stack, tmp_path: Path) -> None:
    key = _keygen(tmp_path / "laptop")
    public = str(key.with_suffix(".pub"))
    assert _cli(stack.home, "clients", "add-key", "nobody", public).returncode == 3
    assert _cli(stack.home, "clients", "add-key", "acme", str(key)).returncode == 2  # private
    added = _cli(stack.home, "clients", "add-key", "acme", public)
    assert added.returncode == 0 and added.stdout.startswith("added SHA256:")
    fingerprint = added.stdout.split()[1]
    expected = subprocess.run(["ssh-keygen", "-lf", public], capture_output=True, text=True)
    assert fingerprint == expected.stdout.split()[1]
    again = _cli(stack.home, "clients", "add-key", "acme", "-", stdin=Path(public).read_text())
    assert "nothing added" in again.stdout
    listed = _cli(stack.home, "clients", "keys", "acme", "--json")
    assert fingerprint in [row["fingerprint"] for row in json.loads(listed.stdout)]
    stack.keys["laptop"] = key
    assert sftp(stack, "ls\n", key="laptop", bind="127.0.0.30").returncode == 0
    removed = _cli(stack.home, "clients", "remove-key", "acme", fingerprint)
    assert removed.returncode == 0 and fingerprint in removed.stdout
    assert sftp(stack, "ls\n", key="laptop", bind="127.0.0.30").returncode == 255
    assert _cli(stack.home, "clients", "remove-key", "acme", fingerprint).returncode == 3
    host_key = stack.home / "state" / "sftp" / "ssh_host_ed25519_key"
    assert stat.S_IMODE(host_key.stat().st_mode) == 0o600
    status = sftp_status(stack.home / "state")
    pinned = subprocess.run(
        ["ssh-keygen", "-lf", f"{host_key}.pub"], capture_output=True, text=True
    ).stdout.split()[1]
    assert status["running"] is True and status["host_key"] == pinned
    assert status["port"] == stack.port
    second = _cli(stack.home, "sftp", "--port", "0")
    assert second.returncode == 5 and "already runs" in second.stderr


# -- the README's upload recipes, with the real clients (issue 21) ----------------------------


def fresh_client(stack: Stack, client: str) -> str:
    """A new client logging in with acme's key, in a folder of its own (no test shares it)."""
    stack.app.billing.add_client(client, 0)
    KeyStore(stack.home / "state").add(client, stack.keys["acme"].with_suffix(".pub").read_text())
    return client


def lftp(stack: Stack, client: str, commands: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Real lftp over sftp://, through OpenSSH with the pinned host key (README recipe).
    Without lftp the test is skipped, except under CI=true (`.ci/run` installs it)."""
    if shutil.which("lftp") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must test the lftp recipes: lftp is not installed")
        pytest.skip("lftp is not installed (Debian: apt-get install lftp)")
    connect = " ".join(["ssh", "-a", "-x", *ssh_options(stack, "acme")[:-2]])
    script = (
        "set cmd:fail-exit yes; set net:max-retries 1; "
        f"set sftp:connect-program '{connect}'; {commands}; bye"
    )
    return subprocess.run(
        ["lftp", "-u", f"{client},", "-e", script, f"sftp://127.0.0.1:{stack.port}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def _outcome_of(stack: Stack, client: str, name: str) -> str:
    folder = stack.folder(client)
    if (folder / "accepted" / f"{name}.receipt.json").exists():
        return "accepted"
    return "rejected" if (folder / "rejected" / f"{name}.error.json").exists() else "waiting"


@pytest.mark.parametrize(
    ("client", "setting"),
    [
        ("lftp-in", "set xfer:use-temp-file yes"),  # lftp's default temporary name: .in.<name>
        ("lftp-part", "set xfer:use-temp-file yes; set xfer:temp-file-name *.part"),
        ("lftp-plain", "set xfer:use-temp-file no"),  # in place
    ],
)
def test_lftp_recipes_upload_into_place(
    stack: Stack, tmp_path: Path, client: str, setting: str
) -> None:
    fresh_client(stack, client)
    (tmp_path / "lftp.json").write_bytes(batch_json("lftp.json", client=client))
    done = lftp(stack, client, f"{setting}; put lftp.json; cls -a", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hidden names" not in done.stderr
    assert wait_for(lambda: _outcome_of(stack, client, "lftp.json") == "accepted", 30), (
        _outcome_of(stack, client, "lftp.json"),
        stack.log_text()[-2000:],
    )
    assert sorted(p.name for p in stack.folder(client).iterdir()) == ["accepted"]
    filed = stack.folder(client) / "accepted" / "lftp.json"
    assert filed.read_bytes() == batch_json("lftp.json", client=client)


def test_openssh_sftp_temporary_name_then_rename(stack: Stack, tmp_path: Path) -> None:
    client = fresh_client(stack, "renamer")
    (tmp_path / "r.json").write_bytes(batch_json("r.json", client=client))
    (tmp_path / "w.json").write_bytes(batch_json("w.json", client=client))
    done = sftp(
        stack,
        "put r.json r.json.part\nrename r.json.part r.json\n"
        "put w.json w.json.filepart\nrename w.json.filepart w.json\n",
        user=client,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    for name in ("r.json", "w.json"):
        assert wait_for(lambda n=name: _outcome_of(stack, client, n) == "accepted", 30), name
    assert sorted(p.name for p in stack.folder(client).iterdir()) == ["accepted"]


def test_hidden_names_are_the_clients_own_but_not_the_endpoints(
    stack: Stack, tmp_path: Path
) -> None:
    client = fresh_client(stack, "hider")
    (tmp_path / "h.json").write_bytes(batch_json("h.json", client=client))
    done = sftp(stack, "put h.json .h.json.AbC123\nls -a -1\n", user=client, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ".h.json.AbC123" in done.stdout and ".sftp-" not in done.stdout
    hidden = stack.folder(client) / ".h.json.AbC123"
    assert hidden.read_bytes() == batch_json("h.json", client=client)
    assert _outcome_of(stack, client, "h.json") == "waiting"  # hidden: never read as it is
    renamed = sftp(stack, "rename .h.json.AbC123 h.json\n", user=client, cwd=tmp_path)
    assert renamed.returncode == 0, renamed.stderr
    assert wait_for(lambda: _outcome_of(stack, client, "h.json") == "accepted", 30)
    (tmp_path / "gone.json").write_bytes(b"{}")
    removed = sftp(stack, "put gone.json .gone.tmp\nrm .gone.tmp\n", user=client, cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert sorted(p.name for p in stack.folder(client).iterdir()) == ["accepted"]
