"""The daemon: single-instance lock, inbox watching, polling and emitting until stopped."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from filelock import FileLock, Timeout

from .billing import Billing
from .callbacks import CallbackPolicy
from .config import Settings
from .emitter import Emitter, FileEmitter, WebhookEmitter
from .errors import AlreadyRunning, DeliveryError, DropboxEvalError, ForgeError
from .fileio import write_json
from .forge import GiteaClient
from .inbox import Inbox, ReadinessTracker, is_candidate_name
from .intake import EvalIntake
from .models import utcnow
from .store import Store
from .watcher import InboxWatcher

log = logging.getLogger("dropbox_eval")
TICK_SECONDS = 0.05
ONCE_TIMEOUT_SECONDS = 60.0


@dataclass
class App:
    """Every component, wired once from the settings."""

    settings: Settings
    store: Store
    billing: Billing
    intake: EvalIntake
    inbox: Inbox


def build_app(settings: Settings, *, with_forge: bool = True) -> App:
    """Wire store, billing, forge client, emitter, intake and inbox from settings."""
    store = Store(settings.state_path)
    billing = Billing(store, settings.task_price)
    gitea = None
    if with_forge and settings.gitea_url and settings.gitea_token:
        gitea = GiteaClient(settings.gitea_url, settings.gitea_token,
                            timeout=settings.forge_timeout,
                            label_lock=settings.state_path / "labels.lock")
    emitter = Emitter(FileEmitter(settings.outbox_path),
                      WebhookEmitter(timeout=settings.callback_timeout),
                      CallbackPolicy(settings.callback_allow))
    intake = EvalIntake(billing, gitea, emitter, settings)
    inbox = Inbox(settings.inbox_path, intake, settings.max_file_bytes)
    settings.outbox_path.mkdir(parents=True, exist_ok=True)
    return App(settings, store, billing, intake, inbox)


class Service:
    """Watches the inbox, opens issues, polls the forge and emits reports."""

    def __init__(self, app: App, *, polling: bool = False) -> None:
        self.app = app
        self.settings = app.settings
        self.polling = polling
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.tracker = ReadinessTracker(self.settings.quiet_period)
        self.status_path = self.settings.state_path / "service.json"
        self.cycles = 0
        self.status: dict[str, Any] = {}

    # -- lifecycle ----------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Run until SIGINT/SIGTERM (or one pass with `once`); returns the exit code."""
        lock = FileLock(str(self.settings.state_path / "service.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise AlreadyRunning(
                f"another dropbox-eval run is using {self.settings.state_path} "
                "(see `dropbox-eval status`)") from None
        try:
            self._install_signal_handlers()
            self._set_status(state="running", pid=os.getpid(), started_at=_now(),
                             last_poll_at=None, last_error=None)
            log.info("service started: inbox %s, outbox %s", self.settings.inbox_path,
                     self.settings.outbox_path)
            self._run_once() if once else self._run_forever()
        finally:
            self._set_status(state="stopped", stopped_at=_now())
            lock.release()
            log.info("service stopped")
        return 0

    def stop(self) -> None:
        """Ask the loop to finish its current step and exit."""
        self.stop_event.set()
        self.wake.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handle(signum: int, _frame: FrameType | None) -> None:
            log.info("received signal %d, finishing the current step", signum)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _run_once(self) -> None:
        self._rescan()
        deadline = time.monotonic() + ONCE_TIMEOUT_SECONDS
        while self.tracker.pending() and time.monotonic() < deadline:
            self._intake_ready()
            if self.stop_event.wait(TICK_SECONDS):
                return
        self.poll_cycle()

    def _run_forever(self) -> None:
        watcher = InboxWatcher(self.app.inbox.root, self._offer, self.wake,
                               on_renamed=lambda path: self._offer(path, renamed=True),
                               polling=self.polling)
        watcher.start()
        try:
            self._rescan()
            next_scan = time.monotonic() + self.settings.rescan_interval
            next_poll = time.monotonic()
            while not self.stop_event.is_set():
                now = time.monotonic()
                if now >= next_scan:
                    self._rescan()
                    next_scan = now + self.settings.rescan_interval
                self._intake_ready()
                if time.monotonic() >= next_poll:
                    self.poll_cycle()
                    next_poll = time.monotonic() + self.settings.poll_interval
                self.wake.wait(TICK_SECONDS if self.tracker.pending() else 1.0)
                self.wake.clear()
        finally:
            watcher.stop()

    # -- steps --------------------------------------------------------------------------

    def _offer(self, path: Path, *, renamed: bool = False) -> None:
        """Called from the observer thread for every event path: keep inbox candidates only.

        `renamed`: the watcher saw a rename into place from a temporary or hidden name, so the
        file is complete and is read at the next look, without the quiet period.
        """
        if not is_candidate_name(self.app.inbox.root, path):
            return
        if renamed:
            self.tracker.renamed(path)
        else:
            self.tracker.changed(path)

    def _rescan(self) -> None:
        for path in self.app.inbox.scan():
            self.tracker.touch(path)

    def _intake_ready(self) -> None:
        for path in self.tracker.ready():
            if self.stop_event.is_set():
                self.tracker.touch(path)
                return
            self._guard(f"file {path}", self.app.inbox.process, path)

    def poll_cycle(self) -> None:
        """Resume interrupted intakes, expire or cancel, poll each repo once, emit."""
        self.cycles += 1
        full = (self.cycles - 1) % self.settings.full_poll_every == 0
        intake = self.app.intake
        rows = self._guard("state", self.app.store.list_batches, live_only=True) or []
        by_repo: dict[str, list[str]] = {}
        for row in rows:
            batch_id = str(row["batch_id"])
            if row["status"] != "running" or self.stop_event.is_set():
                continue
            # False = not overdue; None = the step failed: leave the batch for the next cycle
            if self._guard(f"batch {batch_id}", intake.expire_if_overdue, batch_id) is False:
                self._guard(f"batch {batch_id}", intake.open_issues, batch_id)
                by_repo.setdefault(str(row["repo"]), []).append(batch_id)
        for repo, batch_ids in by_repo.items():
            self._guard(f"repo {repo}", intake.poll_batches, batch_ids, full=full)
        for row in rows:
            if not self.stop_event.is_set():
                self._guard(f"batch {row['batch_id']}", self._deliver, str(row["batch_id"]))
        self._set_status(last_poll_at=_now(), cycles=self.cycles)

    def _deliver(self, batch_id: str) -> None:
        batch = self.app.store.get_batch(batch_id)
        if batch.emitted_at is not None:  # a crash came between emit and archiving
            self.app.store.archive(batch)
        elif self.app.intake.due_for_delivery(batch):
            self.app.intake.emit(batch_id)

    def _guard(self, what: str, step: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one step and return its result; a failure is logged and recorded (result
        None), never fatal to the service."""
        try:
            return step(*args, **kwargs)
        except DeliveryError:
            pass  # already logged and scheduled for retry by the intake
        except ForgeError as exc:
            log.warning("%s: forge error, will retry: %s", what, exc)
            self._set_status(last_error=f"{_now()} {what}: {exc}")
        except DropboxEvalError as exc:
            log.error("%s: %s", what, exc)
            self._set_status(last_error=f"{_now()} {what}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the service must survive any single step
            log.exception("%s: unexpected error", what)
            self._set_status(last_error=f"{_now()} {what}: {exc!r}")
        return None

    def _set_status(self, **fields: Any) -> None:
        self.status.update(fields)
        try:
            write_json(self.status_path, self.status)
        except OSError as exc:  # a full disk must not stop the service; the log still says it
            log.error("cannot write %s: %s", self.status_path, exc)


def read_status(state_dir: Path) -> dict[str, Any]:
    """What `dropbox-eval status` shows: whether a service holds the lock, and its record."""
    path = state_dir / "service.json"
    try:
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    lock = FileLock(str(state_dir / "service.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        record["running"] = True
    else:
        lock.release()
        record["running"] = False
    return record


def _now() -> str:
    return utcnow().isoformat()
