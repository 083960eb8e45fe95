"""App: every part wired once from the settings (the only place that wires)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .billing.accounts import Billing
from .config import Settings
from .delivery.deliverer import Delivery
from .delivery.emitter import Emitter, FileEmitter, WebhookEmitter
from .forge.client import GiteaClient
from .forge.limiter import Limiter
from .forge.scheduler import ForgeScheduler
from .forge.transport import forge_outcome
from .inbox import Inbox
from .intake.accept import Intake
from .intake.pause import Pause
from .intake.resubmit import Retries
from .lifecycle.attempts import Attempts
from .lifecycle.closing import Settler
from .lifecycle.ending import Lifecycle
from .models import TaskRecord
from .ops.statecheck import StateCheck
from .protocol.callbacks import CallbackPolicy
from .protocol.rejections import RejectionLog
from .results.poller import Poller
from .results.webhooks import Nudges, WebhookReceiver
from .store import Store
from .store.secrecy import make_state_private
from .store.statefolder import check_state_path, has_state, make_drop_folders, no_state
from .web.metrics import Metrics


@dataclass
class App:
    """The stages along the data path and the parts they share."""

    settings: Settings
    store: Store
    billing: Billing
    gitea: GiteaClient | None
    inbox: Inbox
    intake: Intake
    poller: Poller
    settler: Settler
    lifecycle: Lifecycle
    delivery: Delivery
    nudges: Nudges
    webhooks: WebhookReceiver
    statecheck: StateCheck
    pause: Pause
    retries: Retries
    metrics: Metrics = field(default_factory=Metrics)


def forge_scheduler(
    settings: Settings, on_limit: Callable[[int], None] | None = None
) -> ForgeScheduler:
    """The fair gate in front of the forge, its budget starting at
    `SAAS_EVAL_INTAKE_CONCURRENCY` and found between 1 and `SAAS_EVAL_FORGE_MAX_INFLIGHT`;
    `on_limit` is told each new budget (the metrics' gauge)."""
    limiter = Limiter(
        initial=settings.intake_concurrency,
        floor=1,
        ceiling=settings.forge_max_inflight,
        on_change=on_limit,
    )
    if on_limit is not None:
        on_limit(limiter.limit)
    weights = settings.weights
    return ForgeScheduler(limiter, forge_outcome, lambda client: weights.get(client, 1))


def build_app(settings: Settings, *, with_forge: bool = True, create: bool = True) -> App:
    """Wire store, billing, forge client, the stages and the inbox from settings.

    Without `create`, a state folder that holds no state is NoState (exit 2) and nothing
    is made: only the commands that set a service up create one (statefolder.py).

    Forge calls and callbacks are tried once per visit: the durable schedule of each
    batch decides the next visit (attempts.py), so no worker ever sleeps on a retry.
    """
    check_state_path(settings)
    new_state = not has_state(settings.state_path)  # an empty mount point counts as new
    if new_state and not create:
        raise no_state(settings)
    make_state_private(settings.state_path)  # an install from before: 0700 / 0600, logged
    store = Store(settings.state_path)
    billing = Billing(store, settings.task_price)
    metrics = Metrics(settings.forge_timeout)
    gitea = None
    if with_forge and settings.gitea_url and settings.gitea_token:
        gitea = GiteaClient(
            settings.gitea_url,
            settings.gitea_token,
            timeout=settings.forge_timeout,
            label_lock=settings.state_path / "labels.lock",
            scheduler=forge_scheduler(settings, metrics.set_forge_inflight_limit),
            observe=metrics.observe_forge,  # every forge call is counted and timed
        )
    emitter = Emitter(
        FileEmitter(settings.outbox_path),
        WebhookEmitter(timeout=settings.callback_timeout),
        CallbackPolicy(settings.callback_allow),
        on_attempt=metrics.count_delivery,
    )
    attempts = Attempts(
        store,
        base=settings.retry_base,
        cap=settings.retry_cap,
        max_attempts=settings.max_attempts,
        delivery_base=settings.delivery_retry_base,
        delivery_max_attempts=settings.delivery_max_attempts,
    )
    settler = Settler(store, billing)
    poller = Poller(store, gitea, settings, settler.close)
    lifecycle = Lifecycle(
        store,
        gitea,
        settings,
        poller.poll_completed,
        poller.reader.read_now,
        settler.close,
        attempts,
    )
    intake = Intake(store, billing, gitea, settings)
    inbox = Inbox(
        settings.inbox_path,
        store,
        intake,
        lifecycle.cancel,
        max_file_bytes=settings.max_file_bytes,
        max_tasks=settings.max_tasks,
        stale_after=settings.stale_upload_seconds,
    )
    if gitea is not None:  # without a service, a batch's issues are opened at once

        def open_now(batch_id: str, tasks: list[TaskRecord] | None = None) -> object:
            return lifecycle.visit(batch_id, intake.open_issues, batch_id, tasks)

        intake.open_now = open_now
        inbox.on_recorded = lambda batch_id, _client: open_now(batch_id)
    pause = Pause(settings.state_path)
    inbox.paused = intake.opener.paused = lifecycle.paused = pause.since
    inbox.on_reject = RejectionLog(settings.state_path).append
    inbox.on_filed = metrics.observe_drop
    make_drop_folders(settings, new_state=new_state)
    nudges = Nudges()
    webhooks = WebhookReceiver(settings.forge_webhook_secret, store.live_repos, nudges)
    delivery = Delivery(store, emitter, settings, attempts)
    return App(
        settings,
        store,
        billing,
        gitea,
        inbox,
        intake,
        poller,
        settler,
        lifecycle,
        delivery,
        nudges,
        webhooks,
        StateCheck(store, billing, settings.delivery_max_attempts),
        pause,
        Retries(intake, pause),
        metrics,
    )
