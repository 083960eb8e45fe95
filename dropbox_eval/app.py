"""App: every part wired once from the settings (the only place that wires)."""

from __future__ import annotations

from dataclasses import dataclass

from .billing import Billing
from .callbacks import CallbackPolicy
from .config import Settings
from .delivery import Delivery
from .emitter import Emitter, FileEmitter, WebhookEmitter
from .forge import GiteaClient
from .inbox import Inbox
from .intake import Intake
from .lifecycle import Lifecycle
from .poller import Poller
from .schedule import Schedule
from .settle import Settler
from .store import Store
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


def build_app(settings: Settings, *, with_forge: bool = True) -> App:
    """Wire store, billing, forge client, the stages and the inbox from settings.

    Forge calls and callbacks are tried once per visit (`attempts=1`): the durable
    schedule of each batch decides the next visit, so no worker ever sleeps on a retry.
    """
    store = Store(settings.state_path)
    billing = Billing(store, settings.task_price)
    gitea = None
    if with_forge and settings.gitea_url and settings.gitea_token:
        gitea = GiteaClient(
            settings.gitea_url,
            settings.gitea_token,
            timeout=settings.forge_timeout,
            attempts=1,
            label_lock=settings.state_path / "labels.lock",
        )
    emitter = Emitter(
        FileEmitter(settings.outbox_path),
        WebhookEmitter(timeout=settings.callback_timeout, attempts=1),
        CallbackPolicy(settings.callback_allow),
    )
    schedule = Schedule(
        store, base=settings.retry_base, cap=settings.retry_cap, max_attempts=settings.max_attempts
    )
    settler = Settler(store, billing)
    poller = Poller(store, gitea, settings, settler)
    lifecycle = Lifecycle(store, gitea, settings, poller, settler, schedule)
    intake = Intake(store, billing, gitea, settings, lifecycle)
    inbox = Inbox(settings.inbox_path, intake, lifecycle, settings.max_file_bytes)
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
    )
