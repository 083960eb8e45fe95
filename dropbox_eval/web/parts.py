"""What the web app is given: the parts its routes use, and nothing else of the service.

The composition root builds them once and hands them to `create_web` (server.py) or, for
the client API alone, to `create_api` (api.py); every route module takes from them only
what it uses, in its factory's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..billing.accounts import Billing
    from ..config import Settings
    from ..delivery.deliverer import Delivery
    from ..forge.client import GiteaClient
    from ..intake.accept import Intake
    from ..intake.pause import Pause
    from ..intake.resubmit import Retries
    from ..lifecycle.ending import Lifecycle
    from ..ops.metrics import Metrics
    from ..results.webhooks import WebhookReceiver
    from ..store import Store
    from ..store.nodes import Node


@dataclass(frozen=True, kw_only=True)
class ApiParts:
    """What the client API uses."""

    settings: Settings  # the body and task limits
    store: Store  # the read model, and the report of an ended batch
    billing: Billing  # the client of an API key
    intake: Intake  # accept a submitted batch
    delivery: Delivery  # deliver a report again
    lifecycle: Lifecycle  # cancel a batch
    retries: Retries  # resubmit a failed or expired batch
    webhooks: WebhookReceiver  # the forge's signed deliveries


@dataclass(frozen=True, kw_only=True)
class WebParts(ApiParts):
    """What the whole web app uses: the API's parts, and the operator's (the page, pause
    and resume, health, metrics)."""

    gitea: GiteaClient | None  # whether the forge answers (readiness)
    pause: Pause
    metrics: Metrics
    node: Node  # every node sharing the store (readiness, the page)
