"""App: every part wired once from the settings (the only place that wires)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .billing import Billing
from .callbacks import CallbackPolicy
from .config import Settings
from .delivery import Delivery
from .emitter import Emitter, FileEmitter, WebhookEmitter
from .errors import ConfigError, NoState
from .forge import GiteaClient
from .inbox import Inbox
from .intake import Intake
from .lifecycle import Lifecycle
from .poller import Poller
from .rejections import RejectionLog
from .schedule import Schedule
from .secrecy import make_state_private
from .settle import Settler
from .statecheck import StateCheck
from .store import Store
from .web.metrics import Metrics
from .webhooks import Nudges, WebhookReceiver


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
    metrics: Metrics = field(default_factory=Metrics)


def open_state(settings: Settings) -> Store:
    """The store opened read-only, for commands that only look: creates nothing, and says
    where it looked when there is no state there (NoState, exit 2)."""
    _check_state_path(settings)
    try:
        return Store(settings.state_path, read_only=True)
    except NoState:
        raise NoState(
            f"no dropbox-eval state at {settings.state_path}: point --home or --state-dir "
            "(SAAS_EVAL_HOME / SAAS_EVAL_STATE_DIR) at the service's folder"
        ) from None


def _check_state_path(settings: Settings) -> None:
    path = settings.state_path
    if path.exists() and not path.is_dir():
        raise ConfigError(f"SAAS_EVAL_STATE_DIR: {path} is not a folder")


def build_app(settings: Settings, *, with_forge: bool = True) -> App:
    """Wire store, billing, forge client, the stages and the inbox from settings.

    Forge calls and callbacks are tried once per visit (`attempts=1`): the durable
    schedule of each batch decides the next visit, so no worker ever sleeps on a retry.
    """
    _check_state_path(settings)
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
            attempts=1,
            label_lock=settings.state_path / "labels.lock",
            observe=metrics.observe_forge,  # every forge call is counted and timed
        )
    emitter = Emitter(
        FileEmitter(settings.outbox_path),
        WebhookEmitter(timeout=settings.callback_timeout, attempts=1),
        CallbackPolicy(settings.callback_allow),
        on_attempt=metrics.count_delivery,
    )
    schedule = Schedule(
        store, base=settings.retry_base, cap=settings.retry_cap, max_attempts=settings.max_attempts
    )
    settler = Settler(store, billing)
    poller = Poller(store, gitea, settings, settler)
    lifecycle = Lifecycle(store, gitea, settings, poller, settler, schedule)
    intake = Intake(store, billing, gitea, settings, lifecycle)
    inbox = Inbox(settings.inbox_path, intake, lifecycle, settings.max_file_bytes)
    inbox.on_reject = RejectionLog(settings.state_path).append
    inbox.on_filed = metrics.observe_drop
    settings.outbox_path.mkdir(parents=True, exist_ok=True)
    nudges = Nudges()
    webhooks = WebhookReceiver(settings.forge_webhook_secret, store.live_repos, nudges)
    delivery = Delivery(store, emitter, settings)
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
        metrics,
    )
