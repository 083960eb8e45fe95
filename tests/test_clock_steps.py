"""Time that only moves forward: a `dropbox-eval run` child whose wall clock steps (NTP, a
VM restore, an operator's fix), its monotonic clock untouched, finishes every batch and
reports it within its normal delays: a forge retry and a callback re-delivery pending when
the clock stepped back an hour are made, in the running process and after a restart.

The wall clock of the child is stepped with libfaketime (Debian's `faketime`), read from a
file the test rewrites while the child runs; the sandbox forge and the callback receiver
run in this process, on the real clock.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import PATIENCE, Receiver, tasks, wait_for
from helpers import finish_issues

from dropbox_eval.app import App
from dropbox_eval.billing.accounts import Billing
from dropbox_eval.config import load_settings
from dropbox_eval.errors import ForgeRetryable
from dropbox_eval.lifecycle.attempts import Attempts
from dropbox_eval.models import BatchRecord, utcnow
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.util.clock import RetryClock
from dropbox_eval.util.fileio import write_atomically

LIBFAKETIME = "/usr/lib/*/faketime/libfaketime.so.1"
# libfaketime 0.9.10 (Debian 12) breaks clock_nanosleep(TIMER_ABSTIME) when the monotonic
# clock is left alone (wolfcw/libfaketime#426), which Python 3.11's time.sleep uses: the
# child sleeps on a semaphore instead, on the same monotonic clock. Nothing else changes.
LAUNCH = """
import sys, threading, time
_gate = threading.Event()
time.sleep = lambda seconds: _gate.wait(max(0.0, seconds)) and None
sys.argv[0] = "dropbox-eval"
from dropbox_eval.cli import main
main()
"""


def libfaketime() -> str:
    """The preload library; missing, the test fails (CI installs Debian's `faketime`)."""
    found = sorted(glob.glob(LIBFAKETIME))
    assert found, f"libfaketime is not installed ({LIBFAKETIME}): apt-get install faketime"
    return found[0]


class Home:
    """A state folder served by `dropbox-eval run` children with a steppable wall clock."""

    def __init__(self, home: Path, forge: SandboxForge, receiver: Receiver) -> None:
        self.home = home
        self.forge = forge
        self.receiver = receiver
        self.offset = home / "faketime.rc"  # the child's wall clock: "+0", "-1h"...
        self.settings = load_settings(home=home)
        Billing(self.store(), 1).add_client("acme", 100)

    def store(self) -> TinyDBStore:
        return TinyDBStore(self.settings.state_path)

    def start(self, offset: str) -> subprocess.Popen[bytes]:
        """`dropbox-eval run` with its wall clock `offset` from the real one."""
        self.step(offset)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAAS_EVAL_", "FAKE"))}
        env.update(
            LD_PRELOAD=libfaketime(),
            FAKETIME_TIMESTAMP_FILE=str(self.offset),
            FAKETIME_NO_CACHE="1",
            FAKETIME_DONT_FAKE_MONOTONIC="1",
            SAAS_EVAL_HOME=str(self.home),
            SAAS_EVAL_GITEA_URL=self.forge.url,
            SAAS_EVAL_GITEA_TOKEN=self.forge.token,
            SAAS_EVAL_OWNER=self.forge.user,
            SAAS_EVAL_POLL_INTERVAL="0.3",
            SAAS_EVAL_QUIET_PERIOD="0.1",
            SAAS_EVAL_SETTLE_SECONDS="0",
            SAAS_EVAL_RETRY_BASE="0.5",
            SAAS_EVAL_RETRY_CAP="1",
            SAAS_EVAL_MAX_ATTEMPTS="1000",  # the forge's outage is the test's, not the batch's
            SAAS_EVAL_DELIVERY_RETRY_BASE="0.5",
            SAAS_EVAL_DELIVERY_MAX_ATTEMPTS="1000",
            SAAS_EVAL_CALLBACK_ALLOW="127.0.0.1",
        )
        with (self.home / "service.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-c", LAUNCH, "run"], env=env, stdout=log, stderr=log
            )

    def step(self, offset: str) -> None:
        """Set the child's wall clock `offset` from the real one (read at its next look)."""
        write_atomically(self.offset, offset + "\n")

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PATIENCE) == 0, self.log()
        for left in (f"faketime_shm_{proc.pid}", f"sem.faketime_sem_{proc.pid}"):
            Path("/dev/shm", left).unlink(missing_ok=True)  # a clean exit leaves none

    def log(self) -> str:
        return (self.home / "service.log").read_text(errors="replace")[-4000:]

    def drop(self, name: str, callback: bool = False) -> None:
        document: dict[str, object] = {"batch_ref": name, "tasks": tasks(2)}
        if callback:
            document["callback_url"] = self.receiver.url
        write_atomically(self.settings.inbox_path / "acme" / f"{name}.json", json.dumps(document))

    def batch(self, ref: str) -> BatchRecord | None:
        rows = [row for row in self.store().list_batches() if row.batch_ref == ref]
        return self.store().get_batch(rows[0].batch_id) if rows else None

    def opened(self, ref: str) -> bool:
        batch = self.batch(ref)
        return batch is not None and batch.intake_done

    def close_issues(self, ref: str) -> None:
        """The lane passes every open issue of the batch."""
        batch = self.batch(ref)
        assert batch is not None
        finish_issues(self.forge, batch.repo)

    def reported(self, ref: str) -> bool:
        batch = self.batch(ref)
        return batch is not None and batch.emitted_at is not None

    def retries_pending(self) -> None:
        """Batch `hook` re-delivers its report, batch `forge` (issues open) retries the
        forge: the receiver and the forge fail until `recover`."""
        self.drop("forge")
        self.drop("hook", callback=True)
        assert wait_for(lambda: self.opened("forge") and self.opened("hook")), self.log()
        self.receiver.answers[:] = [503] * 1000
        self.close_issues("hook")
        assert wait_for(lambda: self._tried("hook", "delivery_attempts")), self.log()
        self.forge.fail_for(10 * PATIENCE)
        assert wait_for(lambda: self._tried("forge", "attempts")), self.log()

    def _tried(self, ref: str, counter: str) -> bool:
        batch = self.batch(ref)
        return batch is not None and getattr(batch, counter) > 0

    def recover(self) -> None:
        """The forge and the receiver answer again; the lane finishes batch `forge`."""
        self.forge.state.faults.clear()
        self.receiver.answers.clear()
        self.close_issues("forge")

    def all_reported(self) -> bool:
        """Batch `forge`'s report is in the outbox, batch `hook`'s was accepted by the
        receiver (a delivery is recorded only once the callback answered 2xx)."""
        return self.reported("forge") and self.reported("hook")

    def assert_reports(self, hours: int) -> None:
        """Both reports out, written by a child whose clock was `hours` off the real one."""
        forge, hook = self.batch("forge"), self.batch("hook")
        assert forge is not None and hook is not None and hook.emitted_at is not None
        assert (self.settings.outbox_path / f"{forge.batch_id}.json").exists()
        posted = [json.loads(body)["batch_id"] for _, body in self.receiver.received]
        assert posted[-1] == hook.batch_id and len(posted) >= 2  # failed, then accepted
        off = hook.emitted_at - utcnow() - timedelta(hours=hours)
        assert abs(off) < timedelta(minutes=10), off  # libfaketime did step the child


@pytest.fixture
def home(tmp_path: Path, forge: SandboxForge, receiver: Receiver) -> Home:
    return Home(tmp_path, forge, receiver)


def test_a_running_service_whose_clock_steps_back_an_hour_still_ends_every_batch(
    home: Home,
) -> None:
    proc = home.start("+0")
    try:
        home.retries_pending()
        home.step("-1h")  # while the forge and the receiver still fail: both tries pending
        home.recover()
        assert wait_for(home.all_reported), home.log()
        home.assert_reports(hours=-1)
    finally:
        home.stop(proc)


@pytest.mark.parametrize("hours", [-1, 1])
def test_a_restart_with_the_clock_stepped_makes_the_stored_tries_when_due(
    home: Home, hours: int
) -> None:
    first = home.start("+0")
    try:
        home.retries_pending()
    finally:
        home.stop(first)
    forge, hook = home.batch("forge"), home.batch("hook")
    assert forge is not None and forge.next_attempt_at is not None
    assert hook is not None and hook.next_delivery_at is not None
    home.recover()
    again = home.start(f"{hours:+d}h")
    try:
        assert wait_for(home.all_reported), home.log()
        home.assert_reports(hours)
    finally:
        home.stop(again)


def test_the_twin_decides_while_the_stored_instant_is_the_one_it_wrote(
    app: App, funded: str
) -> None:
    """In process: the monotonic twin of an instant survives the store's round trip, and
    an instant rewritten elsewhere (or written before a restart) is trusted only up to the
    longest delay the schedule could have given it."""
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    attempts = Attempts(
        app.store, base=10, cap=600, max_attempts=50, delivery_base=10, delivery_max_attempts=50
    )
    monotonic = [0.0]
    attempts.forge_clock = RetryClock(lambda: monotonic[0])

    def ahead() -> timedelta:
        return (app.store.get_batch(batch_id).next_attempt_at or utcnow()) - utcnow()

    while ahead() < timedelta(seconds=1):  # the jitter may draw a wait of nearly nothing
        assert attempts.failed(batch_id, ForgeRetryable("GET /x: forge unreachable")) is None
    assert not attempts.is_due(app.store.get_batch(batch_id))
    monotonic[0] += 601  # past the cap: due by the twin, though the stored instant is ahead
    assert attempts.is_due(app.store.get_batch(batch_id)) and ahead() > timedelta(0)
    now = utcnow()  # attempt 3 waits at most 10 x 2^2 = 40 s
    for seconds, due in ((-3600, True), (20, False), (60, True), (3600, True)):
        moment = now + timedelta(seconds=seconds)  # as another process would write it
        app.store.update_batch(batch_id, attempts=3, next_attempt_at=moment)
        assert attempts.is_due(app.store.get_batch(batch_id)) is due, seconds
    forged = BatchRecord.model_construct(batch_id="b", delivery_attempts=3)
    for seconds, due in ((-3600, True), (20, False), (60, True), (3600, True)):
        forged.next_delivery_at = now + timedelta(seconds=seconds)  # the same rule
        assert attempts.delivery_due(forged) is due, seconds
