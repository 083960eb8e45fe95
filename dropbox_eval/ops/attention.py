"""What needs a person: the list `dropbox-eval check` exits 1 on, one line each, with the
command that resolves it.

- `delivery_given_up`: a finished batch whose report used up its automatic deliveries
  (views/batches.py `delivery_state`) and that no start reschedules (statecheck.py
  `stranded`); the report waits in `outbox/undelivered/` until `emit ID --force`.
- `batch_overdue`: a running batch, holding its credits, more than `overdue_grace` (ten
  poll intervals, at least ten minutes) past its deadline (a record without one:
  `SAAS_EVAL_MAX_COMPLETION_WINDOW` after its creation). The service expires a batch at
  its first visit past the deadline, forge down or not: only no service, a pause or a
  stuck service keeps it running that long.
- `worker_down`: a worker of the running service in `restarting` or `failed` (its status
  file, `<state>/service.json`), or one that `failed` in the file of a service that no
  longer runs (it stopped the service; the next start rewrites the file).
- `inbox_missing`: the running service has waited more than INBOX_GRACE for its inbox
  folder (a share that never mounts; a short wait, such as a remount, resolves itself).
- `storage`: the inbox or outbox is full (no block or no inode left), read-only or
  refused, as its file system says now (storage.py; the state folder's own makes `check`
  fail with one error line before this list).
- `state_problem`: what the state check cannot repair (statecheck.py).

Everything else (a delivery waiting out a backoff, a running batch within its window, what
the next start repairs) the service resolves alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from ..config import Settings
from ..errors import NotFoundError, StorageUnavailable
from ..intake.pause import Pause
from ..models import BatchRecord, BatchStatus, utcnow
from ..store import Store
from ..store.servicestate import WORKER_DOWN, running_status
from ..util import storage
from ..util.timestamps import age, parse, rfc3339
from ..views.batches import delivery_state
from ..views.service import service_view
from .statecheck import Finding, stranded

START_SERVICE = "start the service: dropbox-eval run (systemd: systemctl restart dropbox-eval)"
GRACE_POLLS = 10
GRACE_FLOOR = timedelta(minutes=10)
INBOX_GRACE = timedelta(minutes=10)


@dataclass(frozen=True)
class Attention:
    """One thing a person must resolve: what kind, what it is about, what is wrong, and
    the command (or step) that resolves it."""

    kind: str
    message: str
    action: str
    batch_id: str | None = None
    client_id: str | None = None
    worker: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The item as JSON-ready fields (every key always present)."""
        return asdict(self)

    def line(self) -> str:
        """The item as one line of text."""
        return f"needs a person: {self.message}; resolve: {self.action}"


def overdue_grace(settings: Settings) -> timedelta:
    """How long past its deadline a running batch may stay before a person is needed:
    GRACE_POLLS poll cycles, and at least GRACE_FLOOR (a slow forge, a restart)."""
    return max(GRACE_FLOOR, timedelta(seconds=GRACE_POLLS * settings.poll_interval))


def needs_a_person(
    store: Store, settings: Settings, findings: list[Finding], now: datetime | None = None
) -> list[Attention]:
    """Every item of the module docstring's list, state problems first, then by batch."""
    now = now or utcnow()
    status = running_status(settings.state_path)  # None: no service runs
    items = [_state_problem(finding) for finding in findings if not finding.repairable]
    holder: tuple[str, str] | None = None  # why overdue batches still run: the same for all
    for batch in _live_batches(store):
        if _given_up(batch, settings.delivery_max_attempts):
            items.append(_given_up_item(batch))
        elif batch.status == BatchStatus.RUNNING:
            deadline = _deadline(batch, settings)
            if deadline + overdue_grace(settings) <= now:
                holder = holder or _holder(settings, status, store)
                items.append(_overdue_item(batch, deadline, now, holder))
    items.extend(workers_down(status or service_view(settings.state_path, store.flags())))
    items.extend(inbox_missing(status, now))
    items.extend(_storage_item(problem) for problem in storage.problems(settings))
    return items


def _storage_item(problem: StorageUnavailable) -> Attention:
    return Attention(
        "storage",
        str(problem),
        "free space (or inodes) there, or make it writable again; the service resumes by itself",
    )


def inbox_missing(status: dict[str, Any] | None, now: datetime) -> list[Attention]:
    """The running service's inbox worker `waiting` (its inbox folder missing) for more
    than INBOX_GRACE, from its status record (None when no service runs)."""
    worker = ((status or {}).get("workers") or {}).get("inbox-worker")
    if not isinstance(worker, dict) or worker.get("state") != "waiting":
        return []
    since = parse(worker["since"])
    if now - since < INBOX_GRACE:
        return []
    what = worker.get("detail") or "the inbox folder is missing"
    return [
        Attention(
            "inbox_missing",
            f"{what} for {age(since, now)} (since {rfc3339(since)}): the service waits for "
            "it and takes no drop",
            "mount the share, or make the folder (the service takes its files at once)",
            worker="inbox-worker",
        )
    ]


def workers_down(record: dict[str, Any] | None) -> list[Attention]:
    """The workers that need a person, from the service's status record: of the running
    service (servicestate.running_status) those `restarting` or `failed`; of one that no
    longer runs (views.service_view) the one that `failed` and stopped it."""
    workers = (record or {}).get("workers")
    if not isinstance(workers, dict):
        return []
    running = bool((record or {}).get("running"))
    return [
        _worker_item(name, worker, running)
        for name, worker in sorted(workers.items())
        if isinstance(worker, dict)
        and worker.get("state") in (WORKER_DOWN if running else {"failed"})
    ]


def _live_batches(store: Store) -> list[BatchRecord]:
    """The records of the live folder (a batch archived or gone since the listing is
    skipped: an archived batch was delivered)."""
    batches = []
    for batch_id in sorted(store.stored_batch_ids()):
        try:
            batches.append(store.get_batch(batch_id))
        except NotFoundError:
            continue
    return batches


def _given_up(batch: BatchRecord, max_attempts: int) -> bool:
    return delivery_state(batch) == "given_up" and not stranded(batch, max_attempts)


def _deadline(batch: BatchRecord, settings: Settings) -> datetime:
    """The batch's deadline; for a record without one, the longest window allowed."""
    window = timedelta(seconds=settings.max_completion_window)
    return batch.deadline or batch.created_at + window


def _holder(settings: Settings, status: dict[str, Any] | None, store: Store) -> tuple[str, str]:
    """Why an overdue batch still runs, and what resolves it."""
    paused = Pause(settings.state_path, flags=store.flags()).since()
    if paused is not None:
        return f"intake paused since {paused} (deadlines wait)", "dropbox-eval resume"
    if status is None:
        return "no service runs (its first cycle expires it)", "dropbox-eval run"
    return (
        "the service has not expired it (`dropbox-eval status` says why); cancelling ends it",
        "dropbox-eval cancel {batch_id}",
    )


def _state_problem(finding: Finding) -> Attention:
    return Attention(
        "state_problem",
        f"{finding.subject}: {finding.problem}",
        "an operator must look: restore or fix what it names (no start repairs it)",
    )


def _given_up_item(batch: BatchRecord) -> Attention:
    last = batch.last_delivery_error or "no error recorded"
    return Attention(
        "delivery_given_up",
        f"batch {batch.batch_id} (client {batch.client_id}): report delivery given up after "
        f"{batch.delivery_attempts} attempt(s), the report waits in outbox/undelivered/ "
        f"(last: {last})",
        f"dropbox-eval emit {batch.batch_id} --force",
        batch_id=batch.batch_id,
        client_id=batch.client_id,
    )


def _overdue_item(
    batch: BatchRecord, deadline: datetime, now: datetime, holder: tuple[str, str]
) -> Attention:
    why, action = holder
    return Attention(
        "batch_overdue",
        f"batch {batch.batch_id} (client {batch.client_id}): still running, holding its "
        f"{batch.cost} credit(s), {age(deadline, now)} past its deadline {rfc3339(deadline)}: "
        f"{why}",
        action.format(batch_id=batch.batch_id),
        batch_id=batch.batch_id,
        client_id=batch.client_id,
    )


def _worker_item(name: str, worker: dict[str, Any], running: bool) -> Attention:
    state = worker.get("state")
    facts = [f"{worker.get('restarts', 0)} restart(s)"]
    facts += [
        f"{key} {worker[key]}" for key in ("since", "detail", "last_error") if worker.get(key)
    ]
    if state == "restarting":
        what, action = "the service starts it again after a backoff", "dropbox-eval status"
    else:
        what = "the service stops" if running else "it stopped the service, which is not running"
        action = START_SERVICE
    return Attention(
        "worker_down",
        f"worker {name} {state} ({'; '.join(facts)}): {what}; its log says why it fails",
        action,
        worker=name,
    )
