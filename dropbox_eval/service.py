"""The daemon: single-instance lock, status file, and the workers until stopped."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from types import FrameType
from typing import Any

from filelock import FileLock, Timeout

from .app import App
from .errors import EXIT_FAILED, EXIT_OK, DropboxEvalError, ForgeError, StorageUnavailable
from .forge.client import require_client
from .models import utcnow
from .results.webhooks import register_hook
from .store.servicestate import already_running
from .util.alarm import Alarm
from .util.fileio import write_json
from .util.names import is_reserved_client_id, rename_advice
from .workers import FAST_TICK_SECONDS, DeliveryWorker, ForgeWorker, InboxWorker, OpenWorker
from .workers.supervisor import Supervisor

log = logging.getLogger("dropbox_eval")
ONCE_TIMEOUT_SECONDS = 60.0


class Service:
    """Runs the inbox, forge and delivery workers on their own threads."""

    def __init__(self, app: App, *, polling: bool | None = None) -> None:
        """`polling`: True polls the inbox, False uses inotify, None takes
        `SAAS_EVAL_POLLING`, and when that is unset too polls only an inbox on a network or
        FUSE filesystem (inbox/mounts.py, InboxWorker)."""
        self.app = app
        self.settings = app.settings
        self.stop_event = threading.Event()
        self.status_path = self.settings.state_path / "service.json"
        self.status: dict[str, Any] = {}
        self._status_lock = threading.Lock()
        self.forge_failures = 0  # forge errors reported so far (`run --once` exits 1 on any)
        self.storage_failures = 0  # steps storage refused (likewise)
        self.first_storage_failure = ""
        self.status_unwritten = ""  # why the status file was last not written (likewise)
        choice = self.settings.polling if polling is None else polling
        self.inbox = InboxWorker(app, self.stop_event, self._report, polling=choice)
        self.opener = OpenWorker(app, self._report)
        self.forge = ForgeWorker(
            app,
            self.stop_event,
            self._report,
            self.opener,
            on_full=self.check_state,
            on_cycle=self._cycled,
        )
        self.delivery = DeliveryWorker(app, self.stop_event, self._report)
        self.supervisor = Supervisor(self.stop_event)
        self.supervisor.add("inbox-worker", self.inbox)
        self.supervisor.add("forge-worker", self.forge)
        self.supervisor.add("delivery-worker", self.delivery)
        self.alarm = Alarm("alarm")
        self._wire()

    def _wire(self) -> None:
        """The flow between the stages: none of them calls another."""
        app = self.app
        app.lifecycle.on_error = self._report
        app.inbox.on_recorded = self.opener.offer  # the receipt is out: open its issues
        self.opener.retry_at = self._retry_later  # a failed opening comes back when due
        app.settler.on_closed = lambda _batch_id: self.delivery.wake.set()  # deliver now
        app.poller.on_settling = lambda repo, seconds: self.alarm.after(
            seconds, lambda: app.nudges.add(repo)
        )
        app.pause.on_resume(self.resumed)  # the API's or the page's resume, in this process

    def resumed(self) -> None:
        """Intake resumed: take the waiting files and run a forge cycle now (batches posted
        or retried meanwhile get their issues, stored cancels finish)."""
        log.info("intake resumed: taking the waiting files")
        self.inbox.wake.set()
        self.forge.now.set()
        self.app.nudges.wake.set()

    def _retry_later(self, seconds: float, call: Callable[[], None]) -> None:
        """`call()` in `seconds`, unless the service is stopping by then."""

        def unless_stopping() -> None:
            if not self.stop_event.is_set():
                call()

        self.alarm.after(seconds, unless_stopping)

    @property
    def cycles(self) -> int:
        """Forge cycles run so far."""
        return self.forge.cycles

    def run(self, *, once: bool = False) -> int:
        """Run until SIGINT/SIGTERM (or one pass with `once`); returns the exit code: with
        `once`, EXIT_FAILED when any forge visit of the pass failed, or any step of it
        failed on storage (a cron job sees it)."""
        lock = FileLock(str(self.settings.state_path / "service.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise already_running(self.settings.state_path) from None
        try:
            self._install_signal_handlers()
            self._set_status(
                state="running",
                pid=os.getpid(),
                started_at=_now(),
                last_poll_at=None,
                last_error=None,
                workers=self.supervisor.states(),  # not the last service's (check reads it)
            )
            self.check_state()
            log.info(
                "service started: inbox %s, outbox %s",
                self.settings.inbox_path,
                self.settings.outbox_path,
            )
            self.inbox.log_polling()
            if (since := self.app.pause.since()) is not None:
                log.warning("intake is paused since %s (`dropbox-eval resume` ends it)", since)
            self._warn_reserved_clients()
            if self.settings.forge_webhook_url and self.settings.forge_webhook_secret:
                threading.Thread(
                    target=self._register_webhook, name="webhook-setup", daemon=True
                ).start()
            self._run_once() if once else self._run_forever()
        finally:
            self._publish_workers()
            self.alarm.stop()
            gave_up = self.supervisor.failed  # `status` and `check` show it once stopped
            self._set_status(
                state="stopped",
                stopped_at=_now(),
                **({"last_error": f"{_now()} {gave_up}"} if gave_up else {}),
            )
            lock.release()
            log.info("service stopped")
        if self.supervisor.failed:
            log.error("exit %d: %s", EXIT_FAILED, self.supervisor.failed)
            return EXIT_FAILED
        failed = self._once_failed() if once else None
        if failed:
            log.error("run --once: %s; exit %d", failed, EXIT_FAILED)
            return EXIT_FAILED
        return EXIT_OK

    def _once_failed(self) -> str | None:
        """What failed in the `run --once` pass, in one phrase, or None."""
        failed = []
        if self.forge_failures:
            failed.append(
                f"{self.forge_failures} forge visit(s) failed in this pass (see the warnings above)"
            )
        if self.storage_failures:
            failed.append(
                f"{self.storage_failures} step(s) of this pass failed on storage, first: "
                f"{self.first_storage_failure}"
            )
        elif self.status_unwritten:
            failed.append(f"status file not written: {self.status_unwritten}")
        return "; ".join(failed) or None

    def _warn_reserved_clients(self) -> None:
        """Name every client stored before its id was reserved (names.py), at each start."""
        for client in self.app.store.list_clients():
            if is_reserved_client_id(client.client_id):
                log.warning("%s", rename_advice(client.client_id, client.available))

    def stop(self) -> None:
        """Ask every worker to finish its current step and exit."""
        self.stop_event.set()
        self.inbox.wake.set()
        self.delivery.wake.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handle(signum: int, _frame: FrameType | None) -> None:
            log.info("received signal %d, finishing the current step", signum)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _run_forever(self) -> None:
        self.supervisor.start()
        self._publish_workers()
        try:
            paused = self.app.pause.since()
            while not self.stop_event.wait(1.0):
                self._publish_workers()
                was, paused = paused, self.app.pause.since()
                if was is not None and paused is None:  # resumed by another process
                    self.resumed()
        finally:
            self.stop()
            self.supervisor.join()
            self.opener.shutdown()

    def _publish_workers(self) -> None:
        """The workers' states into the status file, when they changed."""
        workers = self.supervisor.states()
        if workers != self.status.get("workers"):
            self._set_status(workers=workers)

    def _run_once(self) -> None:
        """Take the files present now (unless paused), one forge cycle, deliver what is
        due, exit."""
        self.inbox.rescan()
        deadline = time.monotonic() + ONCE_TIMEOUT_SECONDS
        paused = self.app.pause.since() is not None
        while not paused and self.inbox.tracker.pending() and time.monotonic() < deadline:
            wait(self.inbox.take_ready())
            if self.stop_event.wait(FAST_TICK_SECONDS):
                return
        self.opener.drain()
        self.poll_cycle()
        self.opener.drain()  # resumed intakes the cycle handed over
        wait(self.delivery.deliver_due())
        for worker in (self.inbox, self.forge, self.delivery):
            worker.close()
        self.opener.shutdown()

    def check_state(self) -> None:
        """The state check with repairs (at start, before any worker; and on every full
        reconciliation): what it cannot repair stays in the status for `status` and
        `/readyz` until a later check finds it gone."""
        findings = self.app.statecheck.run(repair=True)
        left = [f.as_dict() for f in findings if not f.repairable]
        self._set_status(
            state_checked_at=_now(),
            state_repaired=sum(1 for f in findings if f.repaired),
            state_problems=left,
        )

    def poll_cycle(self) -> None:
        """One forge cycle, run to its end (for `run --once`, `poll` and tests)."""
        wait(self.forge.cycle())
        self._cycled()

    def _register_webhook(self) -> None:
        """Ask the forge to push issue events to us; polling goes on if it says no."""
        url, secret = self.settings.forge_webhook_url, self.settings.forge_webhook_secret
        assert url is not None and secret is not None
        try:
            gitea = require_client(self.settings, self.app.gitea)
            log.info("%s", register_hook(gitea, self.settings.require_owner(), url, secret))
        except DropboxEvalError as exc:
            log.warning(
                "could not register the forge webhook (%s); add it by hand (README "
                "'Results by push') or rely on polling",
                exc,
            )
            self._report("webhook registration", exc)
        except Exception as exc:  # noqa: BLE001 - its thread must not die with a bare traceback
            log.exception("could not register the forge webhook; rely on polling")
            self._report("webhook registration", exc)

    def _cycled(self) -> None:
        self._set_status(last_poll_at=_now(), cycles=self.forge.cycles)

    def _report(self, what: str, error: Exception) -> None:
        with self._status_lock:
            if isinstance(error, ForgeError):
                self.forge_failures += 1
            elif isinstance(error, StorageUnavailable):
                self.storage_failures += 1
                self.first_storage_failure = self.first_storage_failure or f"{what}: {error}"
        self._set_status(last_error=f"{_now()} {what}: {error}")

    def live_status(self) -> dict[str, Any]:
        """The status as the status file has it, with the workers' states as they are now
        (for `/readyz` in this process: right even when the file cannot be written)."""
        with self._status_lock:
            status = dict(self.status)
        return status | {"running": True, "workers": self.supervisor.states()}

    def _set_status(self, **fields: Any) -> None:
        with self._status_lock:
            self.status.update(fields)
            try:
                write_json(self.status_path, self.status)
            except OSError as exc:  # a full disk must not stop the service; the log says it
                log.error("status file not written: %s", exc)  # the error names the file
                self.status_unwritten = str(exc)


def _now() -> str:
    return utcnow().isoformat()
