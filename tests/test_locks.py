"""SharedLock: exclusive across threads and processes, re-entrant within a thread."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PATIENCE

from dropbox_eval.util.locks import FileClaim, SharedLock, Timeout

HOLD_SCRIPT = """
import sys
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held_by_another_process(path: Path) -> Iterator[None]:
    """A filelock FileLock on `path` held by another process for the block."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCRIPT, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=PATIENCE)


def test_threads_of_one_process_exclude_each_other_and_reenter(tmp_path: Path) -> None:
    lock = SharedLock(tmp_path / "x.lock", timeout=0)
    seen: list[str] = []

    def other() -> None:
        try:
            with lock:
                seen.append("taken")
        except Timeout:
            seen.append("refused")

    with lock, lock:  # re-entrant in the holding thread
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == ["refused"]
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == ["refused", "taken"]


def test_a_waiting_thread_gets_the_lock_when_the_holder_releases(tmp_path: Path) -> None:
    lock = SharedLock(tmp_path / "x.lock")
    order: list[str] = []
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with lock:
            holding.set()
            release.wait(PATIENCE)
            order.append("holder done")

    first = threading.Thread(target=holder)
    first.start()
    assert holding.wait(PATIENCE)

    def waiter() -> None:
        with lock:
            order.append("waiter in")

    second = threading.Thread(target=waiter)
    second.start()
    release.set()
    second.join(PATIENCE)
    first.join(PATIENCE)
    assert order == ["holder done", "waiter in"]


def test_another_process_holding_the_file_makes_a_bounded_wait_time_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.lock"
    with held_by_another_process(path):
        lock = SharedLock(path, timeout=0.2)
        with pytest.raises(Timeout), lock:
            pass
        assert lock._threads.acquire(blocking=False)  # a timeout leaves nothing held
        lock._threads.release()
    with SharedLock(path, timeout=PATIENCE):  # free again once the other process let go
        pass


def test_a_lock_file_replaced_between_holds_is_opened_again(tmp_path: Path) -> None:
    """The descriptor kept open must not lock a removed file while another process locks
    the new one under the same name."""
    path = tmp_path / "x.lock"
    lock = SharedLock(path, timeout=0.2)
    with lock:
        pass
    path.unlink()
    with held_by_another_process(path), pytest.raises(Timeout), lock:
        pass
    with lock:
        assert path.exists()


def test_a_file_claim_excludes_another_until_released(tmp_path: Path) -> None:
    first, second = FileClaim(tmp_path / "b.lock"), FileClaim(tmp_path / "b.lock")
    assert first.take()
    assert not second.take(wait=0.05)
    first.release()
    assert second.take()
    second.release()
