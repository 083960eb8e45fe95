"""The SFTP endpoint's upload completion and listings (issue 31): an upload is hashed as it
is written, made durable in the order durable.py argues (walked here with the endpoint
killed after each step, then the client uploading again), the folder's fsync shared by the
uploads completed together; listings come in pages from a worker thread.

Real files, a real endpoint subprocess, the real service and OpenSSH's `sftp`; the fsync
count is observed by wrapping `os.fsync` (the real call still runs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from asyncssh import FXF_CREAT, FXF_TRUNC, FXF_WRITE, SFTPName
from conftest import tasks, wait_for
from sftp_stack import Stack, running_stack, sftp, start_endpoint

from dropbox_eval.sftp import upload
from dropbox_eval.sftp.bounds import Bounds
from dropbox_eval.sftp.durable import FolderSync
from dropbox_eval.sftp.listing import PAGE, Listing
from dropbox_eval.sftp.paths import Target


def _upload(fd: int, name: str, chunks: list[tuple[int, bytes]]) -> str:
    """Upload `chunks` (offset, bytes) as `name` through upload.py; the sha256 it reports."""
    session = Bounds(16, 32, 1 << 30).session("acme")
    flags = FXF_WRITE | FXF_CREAT | FXF_TRUNC
    started = upload.start(fd, Target(None, name), flags, session)
    for offset, data in chunks:
        upload.write(fd, started, offset, data, 1 << 20)
    return asyncio.run(upload.complete(fd, started, FolderSync()))


def test_the_sha256_is_of_the_bytes_in_place_in_order_or_written_over(
    folder: tuple[Path, int],
) -> None:
    path, fd = folder
    in_order = [(0, b'{"tasks": '), (10, b"[]}")]
    assert _upload(fd, "a.json", in_order) == hashlib.sha256(b'{"tasks": []}').hexdigest()
    written_over = [(0, b'{"tasks": [1]}'), (0, b'{"tasks": [2]}')]  # a client writing again
    digest = _upload(fd, "b.json", written_over)
    assert (path / "b.json").read_bytes() == b'{"tasks": [2]}'
    assert digest == hashlib.sha256(b'{"tasks": [2]}').hexdigest()
    assert sorted(p.name for p in path.iterdir()) == ["a.json", "b.json"]  # no hidden file


def test_renames_completed_together_share_one_folder_fsync(
    folder: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _path, fd = folder
    runs: list[tuple[float, float]] = []
    first_running, let_go = threading.Event(), threading.Event()
    real = os.fsync

    def observed(descriptor: int) -> None:
        started = time.monotonic()
        if not runs and not first_running.is_set():
            first_running.set()
            assert let_go.wait(10)  # the others arrive while the first fsync runs
        real(descriptor)
        runs.append((started, time.monotonic()))

    monkeypatch.setattr(os, "fsync", observed)

    async def main() -> list[tuple[float, float]]:
        sync = FolderSync()

        async def one() -> tuple[float, float]:
            called = time.monotonic()
            await sync.synced(fd)
            return called, time.monotonic()

        first = asyncio.create_task(one())
        await asyncio.to_thread(first_running.wait, 10)
        others = [asyncio.create_task(one()) for _ in range(7)]
        await asyncio.sleep(0)  # they all queue behind the running fsync
        let_go.set()
        return [await first, *[await task for task in others]]

    calls = asyncio.run(main())
    assert len(runs) == 2  # the first alone, then one for the seven that queued
    for called, returned in calls:  # each waited for an fsync that began after its call
        assert any(called <= began and ended <= returned for began, ended in runs)


def test_a_failed_folder_fsync_fails_every_close_it_covered(
    folder: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three closes queue behind a running fsync; the next one, theirs, fails: all three
    fail (a later fsync might not report the error again); a close after that succeeds."""
    _path, fd = folder
    real = os.fsync
    first_running, let_go = threading.Event(), threading.Event()
    runs: list[str] = []

    def failing_second(descriptor: int) -> None:
        runs.append("fsync")
        if len(runs) == 1:
            first_running.set()
            assert let_go.wait(10)
        if len(runs) == 2:
            raise OSError(5, "Input/output error")
        real(descriptor)

    monkeypatch.setattr(os, "fsync", failing_second)

    async def main() -> list[BaseException | None]:
        sync = FolderSync()
        first = asyncio.create_task(sync.synced(fd))
        await asyncio.to_thread(first_running.wait, 10)
        queued = [asyncio.create_task(sync.synced(fd)) for _ in range(3)]
        await asyncio.sleep(0)
        let_go.set()
        await first
        results = await asyncio.gather(*queued, return_exceptions=True)
        later = await asyncio.gather(sync.synced(fd), return_exceptions=True)
        return [*results, *later]

    results = asyncio.run(main())
    assert [type(r) for r in results[:3]] == [OSError, OSError, OSError]
    assert results[3] is None  # a rename after the failure gets an fsync of its own
    assert len(runs) == 3


def test_a_listing_page_is_made_off_the_event_loop(folder: tuple[Path, int]) -> None:
    """The renderer of a page waits for the event loop to run something else: made on the
    loop, the page would wait forever."""
    path, fd = folder
    for n in range(PAGE + 20):
        (path / f"r{n:04d}.json").write_text("{}", encoding="utf-8")
    (path / ".sftp-x.r.json.tmp").write_text("", encoding="utf-8")  # the endpoint's own
    loop_ran = threading.Event()

    def render(entry: SFTPName) -> None:
        assert loop_ran.wait(10), "the page was made on the event loop"

    def open_folder(name: str | None) -> int:
        return os.dup(fd)

    listing = Listing(open_folder, render)

    async def main() -> list[list[str]]:
        asyncio.get_running_loop().call_soon(loop_ran.set)
        names = await listing.folder_names(None)
        return [[e.filename.decode() for e in page] async for page in listing.pages(None, names)]

    pages = asyncio.run(main())
    assert [len(page) for page in pages] == [PAGE, 20]
    assert sum(pages, []) == [f"r{n:04d}.json" for n in range(PAGE + 20)]


def test_the_quota_refuses_only_on_a_fresh_listing(folder: tuple[Path, int]) -> None:
    """Between listings the count only grows: files taken away since the last listing are
    found before a refusal."""
    path, fd = folder
    session = Bounds(16, 32, 4 * 4096).session("acme")
    for n in range(3):
        session.start_upload(fd, f".sftp-{n}.x.part")
        session.grow(f".sftp-{n}.x.part", 10, fd)
        (path / f"p{n}.json").write_bytes(b"x" * 10)  # renamed into place
        session.end_upload(f".sftp-{n}.x.part", kept=True)
    for n in range(3):  # the service takes them away, within the listing's second
        (path / f"p{n}.json").unlink()
    session.start_upload(fd, ".sftp-3.x.part")  # counted 3 blocks + 1: at the quota, fine
    session.start_upload(fd, ".sftp-4.x.part")  # 5 by the count: listed again, 2 in truth


# -- the write order, walked: the endpoint killed after each step --------------------------


def _batch(name: str) -> str:
    return json.dumps({"batch_ref": name.replace(".", "-"), "tasks": tasks(1, prefix=name[:2])})


def _issues(stack: Stack) -> int:
    return sum(
        1
        for e in stack.forge.requests
        if e.method == "POST" and e.path.endswith("/issues") and e.status == 201
    )


def _on_port(stack: Stack, port: int) -> Stack:
    """The stack with its endpoint restarted on `port` (same host key)."""
    known = stack.known_hosts.read_text().split(" ", 1)[1]
    stack.known_hosts.write_text(f"[127.0.0.1]:{port} {known}")
    return dataclasses.replace(stack, port=port)


def test_an_endpoint_killed_while_completing_an_upload_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    """For each step of durable.py's order: the endpoint dies right after it, the client
    (which never had an OK) uploads again to a new endpoint; the drop is one batch, with one
    set of issues, and nothing hidden is left."""
    home = tmp_path / "home"
    settings = {"quiet_period": 600.0, "rescan_interval": 600.0, "poll_interval": 600.0}
    with running_stack(home, ("acme",), task_price=0, **settings) as stack:
        os.kill(stack.pid, signal.SIGTERM)
        os.waitpid(stack.pid, 0)
        steps = ("fsync the upload", "rename it into place", "fsync the client folder")
        for step in range(1, len(steps) + 1):
            name = f"c{step}.json"
            (tmp_path / name).write_text(_batch(name), encoding="utf-8")
            armed = {"DROPBOX_EVAL_CRASH_AFTER": f"sftp-upload:{step}"}
            proc, port = start_endpoint(home, tmp_path / f"crash{step}.log", armed)
            stack = _on_port(stack, port)
            assert sftp(stack, f"put {name}\n", cwd=tmp_path).returncode != 0
            assert proc.wait(timeout=30) == -signal.SIGKILL
            assert (
                f"crash point: sftp-upload write {step}"
                in (tmp_path / f"crash{step}.log").read_text()
            )
            proc, port = start_endpoint(home, tmp_path / f"after{step}.log", {})
            stack = _on_port(stack, port)
            try:
                done = sftp(stack, f"put {name}\n", cwd=tmp_path)  # the client tries again
                assert done.returncode == 0, done.stderr
                folder = stack.folder()
                assert wait_for(lambda f=folder, n=name: _filed(f, n))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)
        refs = [row.batch_ref for row in stack.app.store.list_batches()]
        assert sorted(refs) == ["c1-json", "c2-json", "c3-json"]  # one batch each
        assert wait_for(lambda: _issues(stack) == len(steps))
        assert not wait_for(lambda: _issues(stack) > len(steps), 1.0)
        assert not [p.name for p in stack.folder().iterdir() if p.name.startswith(".sftp-")]


def _filed(folder: Path, name: str) -> bool:
    """The service has read the drop and filed it with its receipt."""
    receipt = folder / "accepted" / f"{name}.receipt.json"
    return receipt.exists() and not (folder / name).exists()
