"""Where a drop's time goes (bench/disk.py --anatomy): measurement only, never the product.

While a burst runs in this process, `watching` takes:
- the process's CPU time, user and system, and its voluntary context switches (each is a
  thread that gave the CPU up to wait: for the GIL, a lock, a disk or a socket);
- the CPU time of the intake threads (the inbox pool: read, check, record, receipt), from
  /proc per thread; the rest is the issues' side (the opener and its creators, the forge
  client) and the service's own loops;
- how long the TinyDB store's lock was held, as a share of the burst: the lock that every
  drop's commit takes, so a share near 1 means drops queue on it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from dropbox_eval.store.base import StoreBase

TICKS = os.sysconf("SC_CLK_TCK")
INTAKE_THREADS = "inbox_"  # the inbox pool's threads (workers/inbox.py)


@dataclass
class Anatomy:
    """One burst's figures, totals over the burst (per drop: `per_drop`)."""

    seconds: float = 0.0
    user: float = 0.0
    system: float = 0.0
    switches: int = 0
    intake_cpu: float = 0.0
    lock_held: float = 0.0
    lock_holds: int = 0

    def per_drop(self, drops: int) -> dict[str, float]:
        """The figures per drop (ms and counts), and the lock's share of the burst."""
        return {
            "user_ms": self.user / drops * 1000,
            "system_ms": self.system / drops * 1000,
            "switches": self.switches / drops,
            "intake_ms": self.intake_cpu / drops * 1000,
            "issues_ms": (self.user + self.system - self.intake_cpu) / drops * 1000,
            "lock_share": self.lock_held / self.seconds if self.seconds else 0.0,
        }


def describe(anatomy: Anatomy | None, drops: int) -> str:
    """One line of the burst's figures per drop."""
    if anatomy is None:
        return ""
    each = anatomy.per_drop(drops)
    lock = f"{each['lock_share']:.0%} of the burst" if anatomy.lock_holds else "not taken"
    return (
        f"user {each['user_ms']:.1f} + system {each['system_ms']:.1f} ms, "
        f"{each['switches']:.0f} context switches; intake threads {each['intake_ms']:.1f} ms, "
        f"the rest {each['issues_ms']:.1f} ms; the store lock held {lock}"
    )


def _thread_cpu(prefix: str) -> dict[int, float]:
    """CPU seconds (user + system) of this process's live threads named `prefix`..."""
    named = {t.native_id: t.name for t in threading.enumerate()}
    found: dict[int, float] = {}
    for tid, name in named.items():
        if tid is None or not name.startswith(prefix):
            continue
        with contextlib.suppress(OSError):
            text = Path(f"/proc/self/task/{tid}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()
            found[tid] = (int(fields[11]) + int(fields[12])) / TICKS
    return found


@contextlib.contextmanager
def watching() -> Iterator[Anatomy]:
    """Measure the block (a burst); the store lock's holds are timed by wrapping
    `StoreBase.locked` while it runs."""
    found = Anatomy()
    real_locked = StoreBase.locked
    depth = threading.local()
    guard = threading.Lock()

    @contextlib.contextmanager
    def timed(store: StoreBase) -> Iterator[None]:
        with real_locked(store):
            outer = getattr(depth, "n", 0) == 0
            depth.n = getattr(depth, "n", 0) + 1
            start = time.perf_counter()
            try:
                yield
            finally:
                depth.n -= 1
                if outer:
                    with guard:
                        found.lock_held += time.perf_counter() - start
                        found.lock_holds += 1

    intake_before = _thread_cpu(INTAKE_THREADS)
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    StoreBase.locked = timed  # type: ignore[method-assign,assignment]
    try:
        yield found
    finally:
        StoreBase.locked = real_locked  # type: ignore[method-assign]
        found.seconds = time.perf_counter() - started
        usage = resource.getrusage(resource.RUSAGE_SELF)
        found.user = usage.ru_utime - usage_before.ru_utime
        found.system = usage.ru_stime - usage_before.ru_stime
        found.switches = usage.ru_nvcsw - usage_before.ru_nvcsw
        intake_after = _thread_cpu(INTAKE_THREADS)
        found.intake_cpu = sum(
            cpu - intake_before.get(tid, 0.0) for tid, cpu in intake_after.items()
        )


def machine_busy() -> float:
    """The machine's busy CPU seconds so far (every core, every process), from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields) - idle) / TICKS


def issues_off() -> contextlib.AbstractContextManager[Any]:
    """No issue is opened while the block runs (the opener is handed nothing): the intake
    path alone, to its receipts."""
    from dropbox_eval.workers.opening import OpenWorker

    return mock.patch.object(OpenWorker, "offer", lambda *_args, **_kwargs: None)
