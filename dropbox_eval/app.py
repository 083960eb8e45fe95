"""The composition root: every part built once from the settings, in order, each given
the collaborators and hooks it uses; nothing is wired after it is built. `build_app` makes
the parts a command uses; `build_service` makes the service with its workers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .billing.accounts import Billing
from .config import Settings
from .delivery.deliverer import Delivery
from .delivery.emitter import Emitter, FileEmitter
from .delivery.webhook import WebhookEmitter
from .forge.client import GiteaClient
from .forge.limiter import Limiter
from .forge.scheduler import ForgeScheduler
from .forge.transport import forge_outcome
from .inbox import Inbox
from .intake.accept import Intake
from .intake.opening import IssueOpener
from .intake.pause import Pause
from .intake.resubmit import Retries
from .lifecycle.attempts import Attempts
from .lifecycle.closing import BatchCloser
from .lifecycle.ending import Lifecycle
from .models import TaskRecord
from .ops.metrics import Metrics
from .ops.statecheck import StateCheck
from .protocol.callbacks import CallbackPolicy
from .protocol.rejections import RejectionLog
from .results.poller import Poller
from .results.webhooks import Nudges, WebhookReceiver
from .service import Service, Workers
from .store import Store
from .store.nodes import Node, default_node_id
from .store.secrecy import make_state_private
from .store.statefolder import check_state_path, has_state, make_drop_folders, no_state, open_store
from .web.parts import WebParts
from .workers.delivery import DeliveryWorker
from .workers.guard import Report
from .workers.heartbeat import Heartbeat
from .workers.inbox import InboxWorker
from .workers.opening import OpenWorker
from .workers.polling import ForgeWorker, PollingStages
from .workers.retention import PruneSchedule, service_retention
from .workers.running import Running
from .workers.status import now_text
from .workers.supervisor import Supervisor


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
    closer: BatchCloser
    lifecycle: Lifecycle
    delivery: Delivery
    nudges: Nudges
    webhooks: WebhookReceiver
    statecheck: StateCheck
    pause: Pause
    retries: Retries
    node: Node
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def web(self) -> WebParts:
        """What the web app (`serve`, `run --http-port`) uses of these parts."""
        return WebParts(
            settings=self.settings,
            store=self.store,
            billing=self.billing,
            intake=self.intake,
            delivery=self.delivery,
            lifecycle=self.lifecycle,
            retries=self.retries,
            webhooks=self.webhooks,
            gitea=self.gitea,
            pause=self.pause,
            metrics=self.metrics,
            node=self.node,
        )


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
    """Every part a command uses, for a process without the service's workers: a batch's
    issues are opened at once, as one visit under its stored schedule.

    Without `create`, a state folder that holds no state is NoState (exit 2) and nothing
    is made: only the commands that set a service up create one (statefolder.py).
    """
    return _build(settings, with_forge=with_forge, create=create, service=None, metrics=None)


def build_service(
    settings: Settings,
    *,
    polling: bool | None = None,
    create: bool = True,
    metrics: Metrics | None = None,
) -> tuple[App, Service]:
    """The service and every part it runs: each part is given the hooks to the workers
    (opener, delivery, alarms, status) as it is built, in order; nothing is wired later.
    `polling`: True polls the inbox, False uses inotify, None takes `SAAS_EVAL_POLLING`,
    and when that is unset too polls only an inbox on a network or FUSE filesystem.
    `metrics`: the process's metrics when they exist already (else new ones)."""
    running = Running(settings.state_path / "service.json")
    app = _build(settings, with_forge=True, create=create, service=running, metrics=metrics)
    choice = settings.polling if polling is None else polling
    inbox = InboxWorker(
        app.inbox,
        settings,
        running.stop,
        running.status.report,
        polling=choice,
        wake=running.wakes.inbox,
    )
    assert running.opener is not None
    status = running.status
    forge = ForgeWorker(
        _polling_stages(app),
        running.stop,
        status.report,
        running.opener,
        on_full=lambda: status.check_state(app.statecheck),
        on_cycle=lambda cycles: status.set(last_poll_at=now_text(), cycles=cycles),
        now=running.wakes.forge,
    )
    delivery = DeliveryWorker(
        app.store,
        app.delivery,
        running.stop,
        status.report,
        wake=running.wakes.delivery,
        node=app.node,
    )
    workers = Workers(
        inbox,
        running.opener,
        forge,
        delivery,
        Supervisor(
            running.stop,
            {"inbox-worker": inbox, "forge-worker": forge, "delivery-worker": delivery},
        ),
        running.alarm,
        running.stop,
        status,
        running.wakes,
        Heartbeat(app.node, settings.lease_seconds, status.report, _budget_share(app.gitea)),
    )
    if settings.retention_days > 0:  # SAAS_EVAL_RETENTION_DAYS: a prune once a day
        prune = service_retention(app.store, app.billing, settings)
        PruneSchedule(prune.prune, running.alarm, running.stop, status.report).start()
    return app, Service(settings, app.store, app.gitea, app.pause, app.statecheck, workers)


def service_for(app: App, *, polling: bool | None = None) -> Service:
    """A service over the same state and settings as `app` (its own parts, with the
    workers' hooks, the process's metrics): for a caller that set the state up with `app`
    first."""
    return build_service(app.settings, polling=polling, metrics=app.metrics)[1]


def forge_worker(app: App, stop: threading.Event, report: Report) -> ForgeWorker:
    """A forge worker over `app`'s stages, with an opener of its own and no service
    around it (a test or a bench drives its cycles)."""
    opener = OpenWorker(app.store, app.intake.opener, app.lifecycle, report)
    return ForgeWorker(_polling_stages(app), stop, report, opener)


def _budget_share(gitea: GiteaClient | None) -> Callable[[int], None] | None:
    """The forge budget's share per node, told the nodes up at each heartbeat."""
    if gitea is None or gitea.scheduler is None:
        return None
    return gitea.scheduler.limiter.share


def _polling_stages(app: App) -> PollingStages:
    return PollingStages(
        app.settings,
        app.store,
        app.gitea,
        app.lifecycle,
        app.poller,
        app.nudges,
        app.metrics,
        app.node,
    )


def _build(
    settings: Settings,
    *,
    with_forge: bool,
    create: bool,
    service: Running | None,
    metrics: Metrics | None,
) -> App:
    """Store, billing, forge client, the stages and the inbox, in order, each given what
    it uses. Forge calls and callbacks are tried once per visit: the durable schedule of
    each batch decides the next visit (attempts.py), so no worker ever sleeps on a retry."""
    check_state_path(settings)
    new_state = not has_state(settings.state_path, settings.database_url)  # empty: new
    if new_state and not create:
        raise no_state(settings)
    # an install from before: 0700 / 0600, logged; the service's start walks all of it
    make_state_private(settings.state_path, everything=service is not None)
    store = open_store(settings.state_path, database_url=settings.database_url)
    node = store.node(
        settings.node_id or default_node_id(settings.state_path), settings.lease_seconds
    )
    billing = Billing(store, settings.task_price)
    metrics = metrics or Metrics(settings.forge_timeout)
    gitea = _forge_client(settings, metrics) if with_forge else None
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
    wakes = service.wakes if service is not None else None
    on_resume = wakes.resumed if wakes is not None else None
    pause = Pause(settings.state_path, on_resume, store.flags())
    closer = BatchCloser(store, billing, on_closed=wakes.batch_closed if wakes else None)
    poller = Poller(
        store,
        gitea,
        settings,
        closer.close,
        on_settling=service.settle_alarm if service is not None else None,
    )
    lifecycle = Lifecycle(
        store,
        gitea,
        settings,
        poller.poll_completed,
        poller.reader.read_now,
        closer.close,
        attempts,
        paused=pause.since,
        on_error=service.status.report if service is not None else None,
    )
    opener = IssueOpener(store, gitea, settings, paused=pause.since)

    def open_now(batch_id: str, tasks: list[TaskRecord] | None = None) -> object:
        return lifecycle.visit(batch_id, opener.open_issues, batch_id, tasks)

    with_issues = gitea is not None  # without a service, a batch's issues open at once
    intake = Intake(
        store, billing, gitea, settings, opener=opener, open_now=open_now if with_issues else None
    )
    on_recorded: Callable[[str, str], object] | None = None
    if service is not None:
        service.opener = OpenWorker(
            store, opener, lifecycle, service.status.report, retry_at=service.retry_later
        )
        on_recorded = service.opener.offer  # the receipt is out: the opener takes it
    elif with_issues:
        on_recorded = lambda batch_id, _client: open_now(batch_id)  # noqa: E731
    inbox = Inbox(
        settings.inbox_path,
        store,
        intake,
        lifecycle.cancel,
        max_file_bytes=settings.max_file_bytes,
        max_tasks=settings.max_tasks,
        stale_after=settings.stale_upload_seconds,
        paused=pause.since,
        on_recorded=on_recorded,
        on_reject=RejectionLog(settings.state_path).append,
        on_filed=metrics.observe_drop,
        node=node,
    )
    make_drop_folders(settings, new_state=new_state)
    nudges = wakes.nudges if wakes is not None else Nudges()
    return App(
        settings,
        store,
        billing,
        gitea,
        inbox,
        intake,
        poller,
        closer,
        lifecycle,
        Delivery(store, emitter, settings, attempts),
        nudges,
        WebhookReceiver(settings.forge_webhook_secret, store.live_repos, nudges),
        StateCheck(store, billing, settings.delivery_max_attempts),
        pause,
        Retries(intake, pause),
        node,
        metrics,
    )


def _forge_client(settings: Settings, metrics: Metrics) -> GiteaClient | None:
    """The forge client when a forge is configured: every call counted and timed."""
    if not (settings.gitea_url and settings.gitea_token):
        return None
    return GiteaClient(
        settings.gitea_url,
        settings.gitea_token,
        timeout=settings.forge_timeout,
        label_lock=settings.state_path / "labels.lock",
        scheduler=forge_scheduler(settings, metrics.set_forge_inflight_limit),
        observe=metrics.observe_forge,
    )
