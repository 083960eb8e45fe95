"""The built-in SFTP endpoint with real clients: OpenSSH's sftp/scp and paramiko.

One endpoint runs as a real `dropbox-eval sftp` subprocess and one real `Service` (inotify
watcher, sandbox forge) runs in a thread, both on the same tmp home, shared by the module
(starting them is the slow part). Each test gets clients of its own (`acme3`, `other3`,
`mallory3`, ...) and so its own inbox folders (made before the service starts), sessions
and log lines: what one test leaves behind, even when it fails half-way, is never in another
test's listing. The service's quiet period is 600 s: an upload becomes a batch within
seconds only because the endpoint renames it into place on close, which the watcher reads
at once. Logins that are meant to fail come from their own loopback address (127.0.0.N),
so the per-address failure limit of one test never locks out another.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun
import paramiko
import pytest
from conftest import read_json, tasks, wait_for
from sftp_stack import (
    Stack,
    can_log_in,
    close,
    keygen,
    paramiko_client,
    running_stack,
    sftp,
    ssh_options,
    transport_to,
)

from dropbox_eval.sftp import sftp_status

MAX_BYTES = 256 * 1024
MAX_FAILURES = 3
MAX_SESSIONS = 2


@pytest.fixture(scope="module")
def endpoint(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """The endpoint and service, shared by the module, with no client of their own: a seat
    (a pair of client folders made before the service starts) for each test."""
    seats = sum(1 for item in request.session.items if item.path == request.path)
    with running_stack(
        tmp_path_factory.mktemp("sftp-home"),
        (),
        seats=seats,
        quiet_period=600.0,
        rescan_interval=600.0,
        poll_interval=600.0,
        task_price=0,
        max_file_bytes=MAX_BYTES,
        sftp_max_sessions=MAX_SESSIONS,
        sftp_max_auth_failures=MAX_FAILURES,
    ) as running:
        yield running


@pytest.fixture
def stack(endpoint: Stack) -> Stack:
    """The endpoint as this test sees it: `acme` and `other` are new clients of its own."""
    return endpoint.own_clients()


def batch_json(client: str, name: str, count: int = 1) -> bytes:
    return json.dumps(
        {
            "client_id": client,
            "batch_ref": name.replace(".", "-"),
            "tasks": tasks(count, prefix=name.split(".")[0]),
        }
    ).encode()


def receipt(stack: Stack, name: str, client: str | None = None) -> dict[str, Any] | None:
    path = stack.folder(client) / "accepted" / f"{name}.receipt.json"
    return read_json(path) if path.exists() else None


def filed(stack: Stack, name: str) -> bool:
    """The drop sits beside its receipt in accepted/ (the receipt is written first, then
    the drop is moved next to it)."""
    accepted = stack.folder() / "accepted"
    return (accepted / f"{name}.receipt.json").exists() and (accepted / name).exists()


def leftovers(stack: Stack, client: str | None = None) -> list[str]:
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
            handle.write(batch_json(stack.acme, "one.json", 3))

        def present() -> bool:
            try:
                client.stat("accepted/one.json.receipt.json")
            except FileNotFoundError:
                return False
            return True

        assert wait_for(present), "no receipt although the quiet period is 600 s"
        client.get("accepted/one.json.receipt.json", str(tmp_path / "r.json"))
    finally:
        close(client)
    got = read_json(tmp_path / "r.json")
    assert got["ok"] is True and got["file"] == "one.json"
    record = stack.app.store.get_batch(got["batch_id"])
    assert record is not None and record.total == 3
    assert wait_for(lambda: f"file=one.json batch={got['batch_id']}" in stack.log_text())
    line = next(x for x in stack.log_lines() if "file=one.json bytes=" in x)
    assert f"client={stack.acme} key=SHA256:" in line and "from=127.0.0.1" in line
    assert "outcome=completed" in line and leftovers(stack) == []


def test_openssh_sftp_and_scp_uploads_become_batches(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "put.json").write_bytes(batch_json(stack.acme, "put.json"))
    (tmp_path / "scp.json").write_bytes(batch_json(stack.acme, "scp.json"))
    done = sftp(stack, "put put.json\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    copied = subprocess.run(
        [
            "scp",
            *ssh_options(stack, "acme"),
            str(tmp_path / "scp.json"),
            f"{stack.acme}@127.0.0.1:scp.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert copied.returncode == 0, copied.stderr
    assert wait_for(lambda: bool(receipt(stack, "put.json") and receipt(stack, "scp.json")))
    fetched = sftp(stack, "get accepted/put.json.receipt.json got.json\n", cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    assert read_json(tmp_path / "got.json") == receipt(stack, "put.json")


def test_winscp_filepart_then_rename_gives_one_batch(stack: Stack) -> None:
    client = paramiko_client(stack)
    try:
        with client.open("win.json.filepart", "wb") as handle:
            handle.write(batch_json(stack.acme, "win.json"))
        assert (stack.folder() / "win.json.filepart").exists()  # not a candidate
        client.rename("win.json.filepart", "win.json")  # SSH_FXP_RENAME, as WinSCP sends
    finally:
        close(client)
    assert wait_for(lambda: filed(stack, "win.json"))
    rejected = stack.folder() / "rejected"
    assert not rejected.exists() or not any(p.name.startswith("win") for p in rejected.iterdir())
    accepted = [p.name for p in (stack.folder() / "accepted").iterdir() if p.name.startswith("win")]
    assert sorted(accepted) == ["win.json", "win.json.receipt.json"]


def test_killed_client_mid_upload_leaves_no_batch(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "slow.json").write_bytes(b" " * 200_000 + batch_json(stack.acme, "slow.json"))
    proc = subprocess.Popen(
        [
            "sftp",
            *ssh_options(stack, "acme"),
            *("-B", "1024", "-l", "8", "-b", "-", f"{stack.acme}@127.0.0.1"),
        ],
        stdin=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "err").open("w"),
    )
    assert proc.stdin is not None
    proc.stdin.write("put slow.json\n")
    proc.stdin.close()
    assert wait_for(lambda: any(".slow.json.tmp" in n for n in leftovers(stack))), (
        tmp_path / "err"
    ).read_text()
    proc.kill()
    proc.wait()
    # the endpoint removes an unfinished upload once it sees the session end: not at once
    assert wait_for(lambda: leftovers(stack) == []), leftovers(stack)
    # paramiko: the connection closes, or only the SFTP channel sends EOF, with the upload open
    for name, end in (("lost.json", "connection"), ("eof.json", "eof")):
        client = paramiko_client(stack)
        handle = client.open(name, "wb")
        handle.write(batch_json(stack.acme, name))
        handle.flush()
        assert len(leftovers(stack)) == 1
        if end == "eof":
            client.get_channel().shutdown_write()  # type: ignore[union-attr]
            assert wait_for(lambda: leftovers(stack) == []), leftovers(stack)
        close(client)
        assert wait_for(lambda: leftovers(stack) == []), leftovers(stack)
    assert wait_for(lambda: sum("outcome=dropped" in x for x in stack.log_lines()) >= 3)
    names = ("slow.json", "lost.json", "eof.json")
    for name in names:
        assert not (stack.folder() / name).exists()
        assert receipt(stack, name) is None
        assert not (stack.folder() / "rejected" / f"{name}.error.json").exists()
    assert not any(b.batch_ref in ("slow-json", "lost-json", "eof-json") for b in _batches(stack))


def _batches(stack: Stack) -> list[Any]:
    return [stack.app.store.get_batch(row.batch_id) for row in stack.app.store.list_batches()]


def test_file_over_the_limit_fails_during_the_upload(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "big.json").write_bytes(b" " * (MAX_BYTES + 1) + batch_json(stack.acme, "big.json"))
    done = sftp(stack, "put big.json\n", cwd=tmp_path)
    assert done.returncode != 0
    assert "Failure" in done.stderr or "too large" in done.stderr, done.stderr
    assert wait_for(
        lambda: any(
            "file=big.json" in line and "outcome=refused (file too large" in line
            for line in stack.log_lines()
        )
    )
    assert wait_for(lambda: leftovers(stack) == []), leftovers(stack)  # removed on close
    assert not (stack.folder() / "big.json").exists()
    client = paramiko_client(stack)  # paramiko shows the server's message
    try:
        with pytest.raises(OSError, match="too large"), client.open("big2.json", "wb") as handle:
            handle.write(b" " * (MAX_BYTES + 1))
    finally:
        close(client)
    assert wait_for(lambda: leftovers(stack) == []), leftovers(stack)
    assert not (stack.folder() / "big2.json").exists()


def test_put_replaces_a_pending_file_and_resumes_are_refused(stack: Stack, tmp_path: Path) -> None:
    folder = stack.folder()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "again.json").write_text("{ not yet")  # pending: the quiet period is 600 s
    (folder / "resume.json.part").write_bytes(b"x" * 10)
    (tmp_path / "again.json").write_bytes(batch_json(stack.acme, "again.json"))
    (tmp_path / "resume.json").write_bytes(b"x" * 20)
    copied = subprocess.run(
        [
            "scp",
            *ssh_options(stack, "acme"),
            str(tmp_path / "again.json"),
            f"{stack.acme}@127.0.0.1:again.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # scp opens without FXF_TRUNC and sets the size at the end
    assert copied.returncode == 0, copied.stderr
    assert wait_for(lambda: filed(stack, "again.json"))
    assert (folder / "accepted" / "again.json").read_bytes() == batch_json(stack.acme, "again.json")
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
        close(client)
    assert (folder / "resume.json.part").read_bytes() == b"x" * 10
    assert wait_for(lambda: leftovers(stack) == []), leftovers(stack)
    assert not (folder / "hole.json").exists()
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
        "get /{other}/accepted/secret.json.receipt.json",
        "get ../{other}/accepted/secret.json.receipt.json",
        "get accepted/../../{other}/accepted/secret.json.receipt.json",
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
    """`{other}` is the other client of this test (its folder is a sibling of acme's)."""
    command = command.format(other=stack.other)
    acme, other = stack.folder(), stack.folder(stack.other)
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
    mallory = stack.add_client("mallory", "acme")
    stack.folder(stack.other).mkdir(parents=True, exist_ok=True)
    stack.folder(mallory).symlink_to(stack.folder(stack.other))
    before = sorted(p.name for p in stack.folder(stack.other).iterdir())
    (tmp_path / "m.json").write_bytes(batch_json(mallory, "m.json"))
    done = sftp(stack, "put m.json\n", user=mallory, cwd=tmp_path)
    assert done.returncode != 0
    assert sorted(p.name for p in stack.folder(stack.other).iterdir()) == before
    assert f"refused session: client={mallory} " in stack.log_text()


def test_listing_shows_only_regular_files_and_receipts_are_readable(
    stack: Stack, tmp_path: Path
) -> None:
    accepted = stack.folder() / "accepted"
    accepted.mkdir(parents=True, exist_ok=True)
    (accepted / "mine.json.receipt.json").write_text('{"mine": 2}')
    link = accepted / "link.json.receipt.json"
    if not link.is_symlink():
        link.symlink_to("/etc/passwd")
    done = sftp(stack, "ls -1 accepted\nget accepted/mine.json.receipt.json\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "mine.json.receipt.json" in done.stdout and "link.json" not in done.stdout
    assert read_json(tmp_path / "mine.json.receipt.json") == {"mine": 2}


def test_a_folder_of_several_pages_lists_every_name_once_in_order(stack: Stack) -> None:
    """Listings come a page (128 names) at a time from a worker thread (listing.py)."""
    accepted = stack.folder() / "accepted"
    accepted.mkdir(parents=True, exist_ok=True)
    names = [f"{n:04d}.json.receipt.json" for n in range(2 * 128 + 5)]
    for name in names:
        (accepted / name).write_text("{}")
    client = paramiko_client(stack)
    try:
        assert client.listdir("accepted") == names
    finally:
        close(client)


# -- the door ---------------------------------------------------------------------------------


def test_wrong_key_wrong_user_and_passwords_are_refused(stack: Stack, tmp_path: Path) -> None:
    wrong_key = sftp(stack, "ls\n", key="stranger", bind="127.0.0.3")
    assert wrong_key.returncode == 255 and "Permission denied (publickey)" in wrong_key.stderr
    wrong_user = sftp(stack, "ls\n", user=stack.other, key="acme", bind="127.0.0.4")
    assert wrong_user.returncode == 255 and "Permission denied" in wrong_user.stderr
    unknown = sftp(stack, "ls\n", user="../acme", key="acme", bind="127.0.0.4")
    assert unknown.returncode == 255
    for attempt in ("password", "keyboard-interactive"):
        transport = transport_to(stack, "127.0.0.5")
        try:
            with pytest.raises(paramiko.BadAuthenticationType) as refused:
                if attempt == "password":
                    transport.auth_password(stack.acme, "hunter2")
                else:
                    transport.auth_interactive_dumb(stack.acme)
            assert refused.value.allowed_types == ["publickey"]
        finally:
            transport.close()
    assert wait_for(lambda: f"failed login from 127.0.0.4 as '{stack.other}'" in stack.log_text())
    refused_key = f"not accepted for user '{stack.acme}'"
    assert any("key SHA256:" in x and refused_key in x for x in stack.log_text().splitlines())


def test_a_reserved_user_name_never_logs_in(stack: Stack) -> None:
    """A key file left for a reserved id (from before ids were reserved) would
    make `inbox/accepted/`, where every top-level drop is filed, someone's SFTP root."""
    keys = stack.home / "state" / "sftp" / "keys"
    acme_key = (keys / f"{stack.acme}.pub").read_text()
    for user, bind in (("accepted", "127.0.0.40"), ("Rejected", "127.0.0.41")):
        (keys / f"{user}.pub").write_text(acme_key)
        refused = sftp(stack, "ls\n", user=user, key="acme", bind=bind)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        with pytest.raises(paramiko.AuthenticationException):
            paramiko_client(stack, user=user, key="acme", bind=bind)
        assert wait_for(lambda u=user: f"login as {u!r} from" in stack.log_text())
    assert "is reserved" in stack.log_text()
    assert sftp(stack, "ls\n", bind="127.0.0.42").returncode == 0  # acme's key still works


def test_repeated_failures_from_one_address_are_refused_early(stack: Stack) -> None:
    for _ in range(MAX_FAILURES):
        assert sftp(stack, "ls\n", key="stranger", bind="127.0.0.6").returncode == 255
    assert wait_for(lambda: stack.log_text().count("failed login from 127.0.0.6") == 3)
    refused = sftp(stack, "ls\n", key="acme", bind="127.0.0.6")  # even the right key
    assert refused.returncode == 255 and "too many failed logins" in refused.stderr
    assert f"refused 127.0.0.6 as '{stack.acme}'" in stack.log_text()
    assert sftp(stack, "ls\n", key="acme", bind="127.0.0.7").returncode == 0  # others are fine
    # and so is another client behind the same address (a shared NAT)
    assert sftp(stack, "ls\n", user=stack.other, key="other", bind="127.0.0.6").returncode == 0


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
        close(client)
    (tmp_path / "legacy.json").write_text("{}")
    legacy = subprocess.run(
        [
            "scp",
            "-O",
            *ssh_options(stack, "acme"),
            str(tmp_path / "legacy.json"),
            f"{stack.acme}@127.0.0.1:legacy.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert legacy.returncode != 0 and not (stack.folder() / "legacy.json").exists()


def test_sessions_per_client_are_limited(stack: Stack) -> None:
    open_sessions = [paramiko_client(stack, bind=f"127.0.0.{8 + i}") for i in range(MAX_SESSIONS)]
    try:
        with pytest.raises((paramiko.SSHException, EOFError)):  # refused while negotiating
            paramiko_client(stack, bind="127.0.0.20")
        assert wait_for(lambda: any("already 2 sessions (limit 2" in x for x in stack.log_lines()))
    finally:
        for session in open_sessions:
            close(session)
    assert wait_for(lambda: can_log_in(stack, bind="127.0.0.21"))


# -- operator commands ------------------------------------------------------------------------


def _cli(home: Path, *args: str, stdin: str | None = None) -> forkrun.Finished:
    return forkrun.run(["--home", str(home), *args], None, 60, input=stdin)


def test_key_commands_and_status(stack: Stack, tmp_path: Path) -> None:
    key = keygen(tmp_path / "laptop")
    public = str(key.with_suffix(".pub"))
    assert _cli(stack.home, "clients", "add-key", "nobody", public).returncode == 3
    assert _cli(stack.home, "clients", "add-key", stack.acme, str(key)).returncode == 2  # private
    added = _cli(stack.home, "clients", "add-key", stack.acme, public)
    assert added.returncode == 0 and added.stdout.startswith("added SHA256:")
    fingerprint = added.stdout.split()[1]
    expected = subprocess.run(["ssh-keygen", "-lf", public], capture_output=True, text=True)
    assert fingerprint == expected.stdout.split()[1]
    again = _cli(stack.home, "clients", "add-key", stack.acme, "-", stdin=Path(public).read_text())
    assert "nothing added" in again.stdout
    listed = _cli(stack.home, "clients", "keys", stack.acme, "--json")
    assert fingerprint in [row["fingerprint"] for row in json.loads(listed.stdout)]
    stack.keys["laptop"] = key
    assert sftp(stack, "ls\n", key="laptop", bind="127.0.0.30").returncode == 0
    removed = _cli(stack.home, "clients", "remove-key", stack.acme, fingerprint)
    assert removed.returncode == 0 and fingerprint in removed.stdout
    assert sftp(stack, "ls\n", key="laptop", bind="127.0.0.30").returncode == 255
    assert _cli(stack.home, "clients", "remove-key", stack.acme, fingerprint).returncode == 3
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


# -- the README's upload recipes, with the real clients -------------------------------------


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
    "setting",
    [
        "set xfer:use-temp-file yes",  # lftp's default temporary name: .in.<name>
        "set xfer:use-temp-file yes; set xfer:temp-file-name *.part",
        "set xfer:use-temp-file no",  # in place
    ],
)
def test_lftp_recipes_upload_into_place(stack: Stack, tmp_path: Path, setting: str) -> None:
    client = stack.acme
    (tmp_path / "lftp.json").write_bytes(batch_json(client, "lftp.json"))
    done = lftp(stack, client, f"{setting}; put lftp.json; cls -a", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hidden names" not in done.stderr
    assert wait_for(lambda: _outcome_of(stack, client, "lftp.json") == "accepted"), (
        _outcome_of(stack, client, "lftp.json"),
        stack.log_text()[-2000:],
    )
    assert wait_for(lambda: sorted(p.name for p in stack.folder(client).iterdir()) == ["accepted"])
    filed = stack.folder(client) / "accepted" / "lftp.json"
    assert filed.read_bytes() == batch_json(client, "lftp.json")


def test_openssh_sftp_temporary_name_then_rename(stack: Stack, tmp_path: Path) -> None:
    client = stack.acme
    (tmp_path / "r.json").write_bytes(batch_json(client, "r.json"))
    (tmp_path / "w.json").write_bytes(batch_json(client, "w.json"))
    done = sftp(
        stack,
        "put r.json r.json.part\nrename r.json.part r.json\n"
        "put w.json w.json.filepart\nrename w.json.filepart w.json\n",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    for name in ("r.json", "w.json"):
        assert wait_for(lambda n=name: _outcome_of(stack, client, n) == "accepted"), name
    assert wait_for(lambda: sorted(p.name for p in stack.folder(client).iterdir()) == ["accepted"])


def test_hidden_names_are_the_clients_own_but_not_the_endpoints(
    stack: Stack, tmp_path: Path
) -> None:
    client = stack.acme
    (tmp_path / "h.json").write_bytes(batch_json(client, "h.json"))
    done = sftp(stack, "put h.json .h.json.AbC123\nls -a -1\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ".h.json.AbC123" in done.stdout and ".sftp-" not in done.stdout
    hidden = stack.folder(client) / ".h.json.AbC123"
    assert hidden.read_bytes() == batch_json(client, "h.json")
    assert _outcome_of(stack, client, "h.json") == "waiting"  # hidden: never read as it is
    renamed = sftp(stack, "rename .h.json.AbC123 h.json\n", cwd=tmp_path)
    assert renamed.returncode == 0, renamed.stderr
    assert wait_for(lambda: _outcome_of(stack, client, "h.json") == "accepted")
    (tmp_path / "gone.json").write_bytes(b"{}")
    removed = sftp(stack, "put gone.json .gone.tmp\nrm .gone.tmp\n", cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert wait_for(lambda: sorted(p.name for p in stack.folder(client).iterdir()) == ["accepted"])


def test_a_client_removes_its_rejected_drops_to_free_its_quota(
    stack: Stack, tmp_path: Path
) -> None:
    client = stack.acme
    (tmp_path / "bad.json").write_bytes(b"{not json")
    assert sftp(stack, "put bad.json\n", cwd=tmp_path).returncode == 0
    assert wait_for(lambda: _outcome_of(stack, client, "bad.json") == "rejected")
    rejected = stack.folder(client) / "rejected"
    (rejected / "link.json").symlink_to(stack.folder(stack.other))
    refused = sftp(stack, "rm rejected/link.json\n", cwd=tmp_path)
    assert refused.returncode != 0 and (rejected / "link.json").is_symlink()
    removed = sftp(stack, "rm rejected/bad.json\nrm rejected/bad.json.error.json\n", cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert sorted(p.name for p in rejected.iterdir()) == ["link.json"]
    assert sftp(stack, "rm accepted/bad.json\n", cwd=tmp_path).returncode != 0
