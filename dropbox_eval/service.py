"""The daemon: single-instance lock, status file, and the workers until stopped."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from .errors import EXIT_FAILED, EXIT_OK, DropboxEvalError
from .forge.client import GiteaClient, require_client
from .ops.sameconfig import published
from .results.webhooks import register_hook
from .store.servicestate import already_running
from .util.names import is_reserved_client_id, rename_advice
from .workers.guard import FAST_TICK_SECONDS
from .workers.status import StatusFile, now_text

if TYPE_CHECKING:
    from types import FrameType

    from .config import Settings
    from .intake.pause import Pause
    from .ops.statecheck import StateCheck
    from .store import Store
    from .util.alarm import Alarm
    from .workers.delivery import DeliveryWorker
    from .workers.heartbeat import Heartbeat
    from .workers.inbox import InboxWorker
    from .workers.opening import OpenWorker
    from .workers.polling import ForgeWorker
    from .workers.supervisor import Supervisor
    from .workers.wakes import Wakes

log = logging.getLogger("dropbox_eval")
ONCE_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Workers:
    """The service's workers and what they share (built by the composition root)."""

    inbox: InboxWorker
    opener: OpenWorker
    forge: ForgeWorker
    delivery: DeliveryWorker
    supervisor: Supervisor
    alarm: Alarm
    stop: threading.Event
    status: StatusFile
    wakes: Wakes
    heartbeat: Heartbeat


class Service:
    """Runs the inbox, forge and delivery workers on their own threads."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gitea: GiteaClient | None,
        pause: Pause,
        statecheck: StateCheck,
        workers: Workers,
    ) -> None:
        self.settings = settings
        self.store = store
        self.gitea = gitea
        self.pause = pause
        self.statecheck = statecheck
        self.workers = workers
        self.stop_event = workers.stop
        self.status_file = workers.status
        self.inbox = workers.inbox
        self.opener = workers.opener
        self.forge = workers.forge
        self.delivery = workers.delivery
        self.supervisor = workers.supervisor
        self.alarm = workers.alarm

    @property
    def status(self) -> dict[str, Any]:
        """The status as last recorded (what the status file says)."""
        return self.status_file.snapshot()

    @property
    def cycles(self) -> int:
        """Forge cycles run so far."""
        return self.forge.cycles

    def run(self, *, once: bool = False) -> int:
        """Run until SIGINT/SIGTERM (or one pass with `once`); returns the exit code: with
        `once`, EXIT_FAILED when any forge visit of the pass failed, or any step of it
        failed on storage (a cron job sees it)."""
        lock = FileLock(str(self.settings.state_path / "service.lock"), mode=0o600)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise already_running(self.settings.state_path) from None
        node = self.workers.heartbeat.node
        try:
            node.join()  # one node per id among those sharing a database
        except BaseException:
            lock.release()
            raise
        try:
            self._install_signal_handlers()
            self.status_file.set(
                state="running",
                pid=os.getpid(),
                started_at=_now(),
                last_poll_at=None,
                last_error=None,
                workers=self.supervisor.states(),  # not the last service's (check reads it)
                settings=published(self.settings),  # `status` compares its own (sameconfig)
            )
            self.check_state()
            log.info(
                "service started: inbox %s, outbox %s",
                self.settings.inbox_path,
                self.settings.outbox_path,
            )
            self.inbox.log_polling()
            if (since := self.pause.since()) is not None:
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
            self.status_file.set(
                state="stopped",
                stopped_at=_now(),
                **({"last_error": f"{_now()} {gave_up}"} if gave_up else {}),
            )
            self._leave()
            lock.release()
            log.info("service stopped")
        if self.supervisor.failed:
            log.error("exit %d: %s", EXIT_FAILED, self.supervisor.failed)
            return EXIT_FAILED
        failed = self.status_file.once_failed() if once else None
        if failed:
            log.error("run --once: %s; exit %d", failed, EXIT_FAILED)
            return EXIT_FAILED
        return EXIT_OK

    def _warn_reserved_clients(self) -> None:
        """Name every client stored before its id was reserved (names.py), at each start."""
        for client in self.store.list_clients():
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
            paused = self.pause.since()
            while not self.stop_event.wait(1.0):
                self.workers.heartbeat.tick()
                self._publish_workers()
                was, paused = paused, self.pause.since()
                if was is not None and paused is None:  # resumed by another process
                    self.workers.wakes.resumed()
        finally:
            self.stop()
            self.supervisor.join()
            self.opener.shutdown()

    def _leave(self) -> None:
        """Give this node's leases back at a clean stop (a kill leaves them to lapse)."""
        try:
            self.workers.heartbeat.node.leave()
        except DropboxEvalError as exc:
            log.warning("could not release this node's leases (they lapse): %s", exc)

    def _publish_workers(self) -> None:
        """The workers' states into the status file, when they changed."""
        workers = self.supervisor.states()
        if workers != self.status_file.snapshot().get("workers"):
            self.status_file.set(workers=workers)

    def _run_once(self) -> None:
        """Take the files present now (unless paused), one forge cycle, deliver what is
        due, exit."""
        self.inbox.rescan()
        deadline = time.monotonic() + ONCE_TIMEOUT_SECONDS
        paused = self.pause.since() is not None
        while not paused and self.inbox.pending() and time.monotonic() < deadline:
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
        """The state check with repairs, its findings in the status (StatusFile)."""
        self.status_file.check_state(self.statecheck)

    def poll_cycle(self) -> None:
        """One forge cycle, run to its end (for `run --once`, `poll` and tests)."""
        wait(self.forge.cycle())
        self.status_file.set(last_poll_at=_now(), cycles=self.forge.cycles)

    def _register_webhook(self) -> None:
        """Ask the forge to push issue events to us; polling goes on if it says no."""
        url, secret = self.settings.forge_webhook_url, self.settings.forge_webhook_secret
        assert url is not None and secret is not None
        try:
            gitea = require_client(self.settings, self.gitea)
            log.info("%s", register_hook(gitea, self.settings.require_owner(), url, secret))
        except DropboxEvalError as exc:
            log.warning(
                "could not register the forge webhook (%s); add it by hand (README "
                "'Results by push') or rely on polling",
                exc,
            )
            self.status_file.report("webhook registration", exc)
        except Exception as exc:  # noqa: BLE001 - its thread must not die with a bare traceback
            log.exception("could not register the forge webhook; rely on polling")
            self.status_file.report("webhook registration", exc)

    def live_status(self) -> dict[str, Any]:
        """The status as the status file has it, with the workers' states as they are now
        (for `/readyz` in this process: right even when the file cannot be written)."""
        status = self.status_file.snapshot()
        return status | {"running": True, "workers": self.supervisor.states()}


def _now() -> str:
    return now_text()
