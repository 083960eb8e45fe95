"""What a small SFTP upload costs (issue 31): its fdatasync begins at its first write and
the close waits for it instead of syncing again, unless something was written after it
began or it failed; key lines are parsed once, read again at every check; the endpoint
speaks AES, not asyncssh's per-packet chacha20-poly1305.

Real files and real syncs (observed by wrapping `os.fdatasync`; the real call still runs),
a real endpoint and OpenSSH's `sftp`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import asyncssh
import pytest
from asyncssh import FXF_CREAT, FXF_TRUNC, FXF_WRITE, SFTPFailure
from conftest import tasks, wait_for
from sftp_stack import running_stack, sftp

from dropbox_eval.sftp import upload
from dropbox_eval.sftp.bounds import Bounds
from dropbox_eval.sftp.durable import FolderSync
from dropbox_eval.sftp.keys import KeyStore
from dropbox_eval.sftp.paths import Target


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bytes]]:
    """Every fdatasync: (inode, the file's bytes when it began)."""
    seen: list[tuple[int, bytes]] = []
    real = os.fdatasync

    def observed(fd: int) -> None:
        seen.append((os.fstat(fd).st_ino, os.pread(fd, 1 << 20, 0)))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", observed)
    return seen


def _started(fd: int, name: str) -> upload.Upload:
    session = Bounds(16, 32, 1 << 30).session("acme")
    return upload.start(fd, Target(None, name), FXF_WRITE | FXF_CREAT | FXF_TRUNC, session)


def _written(fd: int, started: upload.Upload, *chunks: tuple[int, bytes]) -> None:
    for offset, data in chunks:
        upload.write(fd, started, offset, data, 1 << 30)
        upload.sync_early(started)  # as the endpoint does after each write


def test_a_small_upload_is_synced_once_from_its_first_write(
    folder: tuple[Path, int], syncs: list[tuple[int, bytes]]
) -> None:
    path, fd = folder

    async def main() -> None:
        started = _started(fd, "a.json")
        _written(fd, started, (0, b'{"tasks": []}'))
        assert started.early is not None  # begun before the close
        await upload.complete(fd, started, FolderSync())

    asyncio.run(main())
    inode = (path / "a.json").stat().st_ino
    assert syncs == [(inode, b'{"tasks": []}')]  # the early one covered it: no second


def test_a_write_after_the_early_sync_began_is_synced_again_at_the_close(
    folder: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, fd = folder
    began: list[bytes] = []
    first_running, let_go = threading.Event(), threading.Event()
    real = os.fdatasync

    def held(descriptor: int) -> None:
        began.append(os.pread(descriptor, 1 << 20, 0))
        if len(began) == 1:
            first_running.set()
            assert let_go.wait(10)  # the second write lands while the first sync runs
        real(descriptor)

    monkeypatch.setattr(os, "fdatasync", held)

    async def main() -> None:
        started = _started(fd, "b.json")
        _written(fd, started, (0, b'{"tasks": '))
        await asyncio.to_thread(first_running.wait, 10)
        _written(fd, started, (10, b"[]}"))  # no second early sync: one per upload
        let_go.set()
        await upload.complete(fd, started, FolderSync())

    asyncio.run(main())
    assert (path / "b.json").read_bytes() == b'{"tasks": []}'
    assert began == [b'{"tasks": ', b'{"tasks": []}']


def test_a_failed_early_sync_fails_the_upload_and_leaves_nothing(
    folder: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fsync the kernel may mark the pages clean: a later sync could succeed
    without the bytes, so the close fails (the client uploads again)."""
    path, fd = folder
    calls: list[int] = []

    def failing(descriptor: int) -> None:
        calls.append(descriptor)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    reports: list[str] = []

    async def main() -> None:
        started = _started(fd, "c.json")
        _written(fd, started, (0, b"{}"))

        def report(name: str, size: int, outcome: str, digest: str | None) -> None:
            reports.append(outcome)

        with pytest.raises(SFTPFailure):
            await upload.close(fd, started, FolderSync(), report, by_client=True)

    asyncio.run(main())
    assert len(calls) == 1  # the early one only: never retried into a false success
    assert reports and reports[0].startswith("failed")
    assert list(path.iterdir()) == []  # neither the name nor the hidden file


def test_a_large_first_write_is_synced_at_the_close_only(
    folder: tuple[Path, int], syncs: list[tuple[int, bytes]]
) -> None:
    path, fd = folder
    big = b"x" * (upload.EARLY_SYNC_BYTES + 1)

    async def main() -> None:
        started = _started(fd, "d.json")
        _written(fd, started, (0, big))
        assert started.early is None
        await upload.complete(fd, started, FolderSync())

    asyncio.run(main())
    assert [data for _inode, data in syncs] == [big]


def test_a_discarded_upload_does_not_wait_for_its_early_sync(
    folder: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session ended before the close: the hidden file goes at once; the early sync
    finishes on a descriptor of its own, and its error is nobody's news."""
    path, fd = folder
    running, let_go = threading.Event(), threading.Event()

    def slow(descriptor: int) -> None:
        running.set()
        assert let_go.wait(10)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", slow)

    async def main() -> None:
        started = _started(fd, "e.json")
        _written(fd, started, (0, b"{}"))
        await asyncio.to_thread(running.wait, 10)
        await upload.close(fd, started, FolderSync(), lambda *_: None, by_client=False)
        assert list(path.iterdir()) == []
        let_go.set()
        assert started.early is not None
        with pytest.raises(OSError):
            await started.early

    asyncio.run(main())


def test_a_removed_key_counts_at_once_though_lines_are_parsed_once(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "state")
    try:
        line = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
        added = keys.add("acme", line)
        assert [k.fingerprint for k in keys.keys("acme")] == [added[0].fingerprint]
        assert keys.keys("acme") == keys.keys("acme")  # the second from parsed lines
        keys.remove("acme", added[0].fingerprint)
        assert keys.keys("acme") == []
    finally:
        keys.close()


def test_the_endpoint_speaks_aes_to_openssh_and_refuses_chacha20(tmp_path: Path) -> None:
    home = tmp_path / "home"
    batch = tmp_path / "one.json"
    batch.write_text(json.dumps({"batch_ref": "one", "tasks": tasks(1)}), encoding="utf-8")
    with running_stack(home, ("acme",), task_price=0, quiet_period=600.0) as stack:
        done = sftp(stack, f"put {batch} one.json\n", extra=("-v",))
        assert done.returncode == 0, done.stderr
        assert "client->server cipher: aes" in done.stderr
        refused = sftp(stack, "pwd\n", extra=("-c", "chacha20-poly1305@openssh.com"))
        assert refused.returncode != 0
        assert "no matching cipher" in refused.stderr
        assert wait_for(lambda: (stack.folder() / "accepted" / "one.json.receipt.json").exists())
