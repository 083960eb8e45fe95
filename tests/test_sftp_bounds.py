"""Per-client bounds of the SFTP endpoint, so one client cannot starve the others, black-box.

A real `dropbox-eval sftp` runs under a 256-descriptor limit (soft and hard) beside a real
service, with small limits, and real clients (OpenSSH's `sftp`, paramiko) push on each
bound: one client's retries, failures, open files and pending bytes must never reach
another client, and names with control characters never reach a log line raw.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from conftest import read_json, wait_for
from sftp_stack import (
    Stack,
    can_log_in,
    close,
    paramiko_client,
    running_stack,
    sftp,
    start_endpoint,
    transport_to,
)

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings

MAX_SESSIONS = 2
MAX_FAILURES = 3
MAX_USERS = 3
SESSION_FILES = 4
CLIENT_FILES = 6
MAX_BYTES = 32 * 1024
QUOTA = 64 * 1024
STALE_SECONDS = 3.0
DESCRIPTORS = 256


QUOTA_TESTS = 2  # the tests whose exact folder listings need clients of their own


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("bounds-home"),
        ("acme", "other"),
        seats=QUOTA_TESTS,
        limit_files=(DESCRIPTORS, DESCRIPTORS),
        quiet_period=600.0,
        rescan_interval=0.5,
        poll_interval=600.0,
        task_price=0,
        max_file_bytes=MAX_BYTES,
        client_quota_bytes=QUOTA,
        stale_upload_seconds=STALE_SECONDS,
        sftp_max_sessions=MAX_SESSIONS,
        sftp_max_auth_failures=MAX_FAILURES,
        sftp_max_auth_users=MAX_USERS,
        sftp_max_open_files=SESSION_FILES,
        sftp_max_client_open_files=CLIENT_FILES,
    ) as running:
        yield running


@pytest.fixture
def own(stack: Stack) -> Stack:
    """The stack with `acme` and `other` new clients of this test's own: what it lists in
    their folders no other test has touched."""
    return stack.own_clients()


def batch_json(client: str, ref: str) -> bytes:
    return (
        f'{{"client_id": "{client}", "batch_ref": "{ref}", '
        f'"tasks": [{{"task_id": "t1", "title": "T", "body": "b", "acceptance": ["a"]}}]}}'
    ).encode()


def receipt(stack: Stack, client: str, name: str) -> dict[str, object] | None:
    path = stack.folder(client) / "accepted" / f"{name}.receipt.json"
    return read_json(path) if path.exists() else None


def upload(client: paramiko.SFTPClient, name: str, data: bytes) -> None:
    with client.open(name, "wb") as handle:
        handle.write(data)


def stranger_key(stack: Stack) -> paramiko.Ed25519Key:
    return paramiko.Ed25519Key.from_private_key_file(str(stack.keys["stranger"]))


def sessions(stack: Stack, count: int, bind: str = "127.0.0.1") -> list[paramiko.SFTPClient]:
    """`count` sessions of acme, waiting for the endpoint to see earlier ones end."""
    opened: list[paramiko.SFTPClient] = []

    def one_more() -> bool:
        try:
            opened.append(paramiko_client(stack, bind=bind))
        except (paramiko.SSHException, EOFError):
            return False
        return True

    for _ in range(count):
        assert wait_for(one_more, 30), "a session of an earlier test is still open"
    return opened


# -- one client's retries and failures lock out no one else --------------------------


def test_retrying_past_the_session_limit_is_no_failed_login(stack: Stack) -> None:
    held = sessions(stack, MAX_SESSIONS, bind="127.0.0.50")
    try:
        for _ in range(MAX_FAILURES + 2):  # a client script retrying past its limit
            with pytest.raises((paramiko.SSHException, EOFError)):
                paramiko_client(stack, bind="127.0.0.50")
        over = f"already {MAX_SESSIONS} sessions"
        assert wait_for(lambda: stack.log_text().count(over) >= MAX_FAILURES + 2, 30)
        assert can_log_in(stack, user="other", bind="127.0.0.50")  # the same address (NAT)
    finally:
        for session in held:
            close(session)
    assert wait_for(lambda: can_log_in(stack, bind="127.0.0.50"), 30)  # not locked out
    assert "failed login from 127.0.0.50" not in stack.log_text()
    assert "not counted as a failed login" in stack.log_text()


def test_failures_lock_out_that_user_at_that_address_only(stack: Stack) -> None:
    for _ in range(MAX_FAILURES):
        assert sftp(stack, "ls\n", key="stranger", bind="127.0.0.51").returncode == 255
    mine = "failed login from 127.0.0.51 as 'acme'"
    assert wait_for(lambda: stack.log_text().count(mine) == MAX_FAILURES, 30)
    refused = sftp(stack, "ls\n", key="acme", bind="127.0.0.51")  # even with its right key
    assert refused.returncode == 255
    assert "too many failed logins as 'acme' from your address" in refused.stderr
    assert sftp(stack, "ls\n", user="other", key="other", bind="127.0.0.51").returncode == 0
    assert sftp(stack, "ls\n", bind="127.0.0.52").returncode == 0  # acme from elsewhere


def test_a_spray_across_user_names_locks_the_address(stack: Stack) -> None:
    for n in range(MAX_USERS):  # one wrong login each for several names, as a spray does
        name = f"user{n}"
        done = sftp(stack, "ls\n", user=name, key="stranger", bind="127.0.0.53")
        assert done.returncode == 255
    assert wait_for(lambda: stack.log_text().count("failed login from 127.0.0.53") == 3, 30)
    for user in ("acme", "other"):
        refused = sftp(stack, "ls\n", user=user, key=user, bind="127.0.0.53")
        assert refused.returncode == 255
        assert "too many failed logins from your address" in refused.stderr
    transport = transport_to(stack, "127.0.0.54")  # one connection, many names
    try:
        with pytest.raises((paramiko.SSHException, EOFError)):
            for n in range(MAX_USERS + 1):
                with pytest.raises(paramiko.AuthenticationException):
                    transport.auth_publickey(f"name{n}", stranger_key(stack))
    finally:
        transport.close()
    assert sftp(stack, "ls\n", bind="127.0.0.55").returncode == 0


# -- open files, per session and per client -------------------------------------------


def test_open_files_are_capped_per_session_and_per_client(stack: Stack) -> None:
    first, second = sessions(stack, 2)
    handles = []
    try:
        handles = [first.open(f"open{n}.json.part", "wb") for n in range(SESSION_FILES)]
        with pytest.raises(OSError, match="too many open files: 4 in this session"):
            first.open("one-more.json.part", "wb")
        with pytest.raises(OSError, match="SAAS_EVAL_SFTP_MAX_OPEN_FILES"):
            first.open("accepted/none.json.receipt.json", "rb")  # downloads count too
        left = CLIENT_FILES - SESSION_FILES
        handles += [second.open(f"more{n}.json.part", "wb") for n in range(left)]
        with pytest.raises(OSError, match="6 in your sessions .*CLIENT_OPEN_FILES"):
            second.open("past.json.part", "wb")
        other = paramiko_client(stack, user="other", key="other")
        try:  # another client is not held back by acme's handles
            upload(other, "theirs.json", batch_json("other", "theirs"))
        finally:
            close(other)
        assert wait_for(lambda: receipt(stack, "other", "theirs.json") is not None, 30)
        handles.pop().close()
        with second.open("again.json.part", "wb") as handle:  # a closed handle frees a slot
            handle.write(b"{}")
    finally:
        for handle in handles:
            handle.close()
        close(first)
        close(second)
    for leftover in stack.folder("acme").glob("*.json.part"):
        leftover.unlink()


def test_hoarding_descriptors_under_a_low_limit_starves_no_one(stack: Stack) -> None:
    """The endpoint runs with 256 descriptors: one client opening 400 files over every
    session it may hold is refused past its caps, and another client still logs in."""
    held = sessions(stack, MAX_SESSIONS, bind="127.0.0.56")
    opened, refused = [], 0
    try:
        for n in range(400):
            try:
                opened.append(held[n % MAX_SESSIONS].open(f"h{n}.json.part", "wb"))
            except OSError:
                refused += 1
        assert len(opened) == CLIENT_FILES and refused == 400 - CLIENT_FILES
        for attempt in range(5):  # and the rest of the endpoint is untouched
            assert can_log_in(stack, user="other", bind=f"127.0.0.{60 + attempt}")
    finally:
        for handle in opened:
            handle.close()
        for session in held:
            close(session)
    for leftover in stack.folder("acme").glob("h*.json.part"):
        leftover.unlink()


def test_the_endpoint_raises_its_soft_descriptor_limit_at_start(tmp_path: Path) -> None:
    build_app(load_settings(home=tmp_path), with_forge=False)  # the endpoint needs a state
    proc, _ = start_endpoint(tmp_path, tmp_path / "log", {}, limit_files=(64, 1024))
    try:
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    assert line.split()[3:5] == ["1024", "1024"], line
    assert "raised from 64 to 1024" in (tmp_path / "log").read_text()


# -- the storage quota and the sweep ---------------------------------------------------


def test_pending_bytes_over_the_quota_are_refused_with_a_clear_message(
    own: Stack, tmp_path: Path
) -> None:
    stack, third = own, own.acme
    client = paramiko_client(stack, user=third, key="acme")
    try:
        upload(client, "a.json.part", b" " * 30_000)  # 8 blocks of 4 KiB each
        upload(client, "b.json.part", b" " * 30_000)  # the quota (16 blocks) is full
        with pytest.raises(OSError, match="over your storage quota.*CLIENT_QUOTA_BYTES"):
            upload(client, "c.json", b"{}")
        assert sorted(p.name for p in stack.folder(third).iterdir()) == [
            "a.json.part",
            "b.json.part",
        ]  # the refused upload left nothing
        (tmp_path / "d.json").write_bytes(batch_json(third, "d"))
        refused = sftp(stack, "put d.json\n", user=third, key="acme", cwd=tmp_path)
        assert refused.returncode != 0  # OpenSSH's client shows only "Failure"
        logged = "file=d.json bytes=0 outcome=refused (over your storage quota"
        assert wait_for(lambda: logged in stack.log_text(), 30)
        other = paramiko_client(stack, user=own.other, key="other")
        try:  # another client's quota is its own
            upload(other, "big.json.part", b" " * 30_000)
            other.remove("big.json.part")
        finally:
            close(other)
        client.remove("a.json.part")  # room again
        upload(client, "e.json", batch_json(third, "e"))
    finally:
        close(client)
    assert wait_for(lambda: receipt(stack, third, "e.json") is not None, 30)
    (stack.folder(third) / "b.json.part").unlink()


def test_a_growing_upload_is_discarded_when_it_passes_the_quota(own: Stack) -> None:
    stack, third = own, own.acme
    client = paramiko_client(stack, user=third, key="acme")
    try:
        upload(client, "keep.json.part", b" " * 30_000)  # 8 blocks
        upload(client, "also.json.part", b" " * 20_000)  # 5 blocks: 3 are left
        with pytest.raises(OSError, match="over your storage quota"):
            upload(client, "grow.json.part", b" " * 20_000)  # opens, then passes it
        assert not any("grow" in p.name for p in stack.folder(third).iterdir())
        logged = "file=grow.json.part bytes=0 outcome=refused (over your storage quota"
        assert wait_for(lambda: logged in stack.log_text(), 30)
        client.remove("keep.json.part")
        client.remove("also.json.part")
    finally:
        close(client)


def test_stale_temporary_uploads_are_swept_and_logged(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="dropbox_eval")
    client = paramiko_client(stack, user="other", key="other")
    try:
        upload(client, "stalled.json.filepart", b"{")
    finally:
        close(client)
    folder = stack.folder("other")
    (folder / ".rsync-tmp.json.Ab12Cd").write_text("{")  # a shared-folder client's leftover
    (stack.home / "inbox" / "top.json.tmp").write_text("{")
    live = folder / "live.json.part"
    live.write_text("{")
    gone = (folder / "stalled.json.filepart", folder / ".rsync-tmp.json.Ab12Cd")

    def swept() -> bool:
        with live.open("a") as handle:  # an upload still being written is never stale
            handle.write(" ")
        return not any(p.exists() for p in (*gone, stack.home / "inbox" / "top.json.tmp"))

    assert wait_for(swept, 60)
    assert live.exists()
    lines = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
    assert any("other/stalled.json.filepart" in line for line in lines), lines
    assert any("SAAS_EVAL_STALE_UPLOAD_SECONDS" in line for line in lines), lines
    live.unlink()


# -- names reach no log line raw ------------------------------------------------------

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ |^  ")


def test_names_with_control_characters_are_refused_and_never_logged_raw(stack: Stack) -> None:
    forged = "2026-12-01 00:00:00,000 INFO sftp session start: client=root"
    client = paramiko_client(stack)
    try:
        for name in (f"evil\n{forged}.json", "bell\a.json", "esc\x1b[2J.json", "rtl\u202e.json"):
            with pytest.raises(OSError, match="control character"):
                upload(client, name, b"{}")
    finally:
        close(client)
    transport = transport_to(stack, "127.0.0.70")
    try:  # asyncssh refuses such a user name itself (SASLprep), before any log line
        with pytest.raises((paramiko.SSHException, EOFError)):
            transport.auth_publickey(f"x\n{forged}\x1b[31m", stranger_key(stack))
    finally:
        transport.close()
    assert sftp(stack, "ls\n", user="acme", key="stranger", bind="127.0.0.71").returncode == 255
    assert wait_for(lambda: "failed login from 127.0.0.71" in stack.log_text(), 30)
    raw = stack.log.read_bytes()
    assert b"\x1b" not in raw and b"\a" not in raw and "\u202e".encode() not in raw
    lines = raw.decode("utf-8").splitlines()
    assert all(LOG_LINE.match(line) for line in lines), [x for x in lines if not LOG_LINE.match(x)]
    assert not any(line.startswith(forged) for line in lines)
    assert not list(stack.folder("acme").glob("*evil*"))


def test_openssh_sftp_still_takes_ordinary_names(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "plain name é.json").write_bytes(batch_json("acme", "plain"))
    done = sftp(stack, 'put "plain name é.json"\n', cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert wait_for(lambda: receipt(stack, "acme", "plain name é.json") is not None, 30)
