"""Forge webhooks: results by push, polling as the backstop.

Gitea/Forgejo POST an event when an issue is closed, labelled or commented, or a pull
request changes. A delivery is accepted only when it is signed with the shared secret
(`X-Gitea-Signature` / `X-Forgejo-Signature`: hex HMAC-SHA256 of the JSON payload: the body,
or with a hook of the `form` content type its `payload` field, which is what Gitea signs),
was not seen before, and names a repo of a running batch; it then asks the forge worker to
poll that repo now instead of at the next interval. "Seen before" is its delivery id
(`X-Gitea-Delivery` / `X-Forgejo-Delivery`, a UUID per delivery) within REPLAY_WINDOW
seconds, never its bytes: a label put on, taken off and put on again sends byte-identical
payloads as distinct deliveries, and each is news. A delivery without an id is known by
the digest of its payload instead. A payload sent again under a new id is accepted: it
only asks for a poll, which reads the forge. A payload that is not well-formed JSON of
sane depth naming its repository is refused as `bad_payload` (400). Every refusal is
counted and changes nothing: the delivery carries no result, the service reads the issue
itself.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from pydantic import BaseModel, Field, ValidationError

from ..util.redact import shown_url

if TYPE_CHECKING:
    from ..forge.client import GiteaClient

log = logging.getLogger("dropbox_eval")
EVENTS = ("issues", "issue_comment", "pull_request")
REMEMBERED_DELIVERIES = 10_000
REPLAY_WINDOW = 3600.0
WEBHOOK_OUTCOMES = (
    "accepted",
    "ignored_event",
    "unsigned",
    "bad_signature",
    "replayed",
    "bad_payload",
    "unknown_repo",
    "not_configured",
)
"""Every outcome `WebhookReceiver.receive` counts (the metrics start each at 0)."""


class Nudges:
    """Repos that a webhook says changed, waiting for the forge worker (thread-safe)."""

    def __init__(self) -> None:
        self._repos: set[str] = set()
        self._lock = threading.Lock()
        self.wake = threading.Event()

    def add(self, repo: str, *, wake: bool = True) -> None:
        """Ask for a poll of `repo` now (`wake=False`: at the worker's next tick)."""
        with self._lock:
            self._repos.add(repo.casefold())
        if wake:
            self.wake.set()

    def take(self) -> set[str]:
        """The repos asked for since the last call (case-folded)."""
        with self._lock:
            repos, self._repos = self._repos, set()
        return repos


class WebhookReceiver:
    """Checks one delivery and turns it into a nudge, or refuses it with a reason."""

    def __init__(
        self,
        secret: str | None,
        live_repos: Callable[[], set[str]],
        nudges: Nudges,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.secret = secret
        self.live_repos = live_repos
        self.nudges = nudges
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self._seen: OrderedDict[str, float] = OrderedDict()  # delivery id -> when first seen
        self._lock = threading.Lock()

    def receive(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """(HTTP status, outcome) for one delivery; `headers` have lower-case names."""
        status, outcome = self._judge(headers, body)
        with self._lock:
            self.counts[outcome] += 1
        if status >= 400:
            # a signed delivery about a repo with no live batch is routine (the forge's
            # events about a batch that just ended: about three per issue); counted, and
            # logged at debug, not a warning per delivery
            level = logging.DEBUG if outcome == "unknown_repo" else logging.WARNING
            log.log(
                level,
                "forge webhook refused (%s), delivery %s",
                outcome,
                _delivery_id(headers) or "-",
            )
        return status, outcome

    def _judge(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        if not self.secret:
            return 404, "not_configured"
        signature = headers.get("x-gitea-signature") or headers.get("x-forgejo-signature")
        if not signature:
            return 401, "unsigned"
        body = signed_payload(headers, body)
        expected = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(signature.strip().lower(), expected):
            return 401, "bad_signature"
        delivery = _delivery_id(headers) or f"sha256:{hashlib.sha256(body).hexdigest()}"
        if not self._first_time(delivery):
            return 409, "replayed"
        event = headers.get("x-gitea-event") or headers.get("x-forgejo-event") or ""
        if event not in EVENTS:
            return 202, "ignored_event"
        repo = _repo_of(body)
        if repo is None:
            return 400, "bad_payload"
        if repo.casefold() not in self.live_repos():
            return 404, "unknown_repo"
        self.nudges.add(repo)
        return 202, "accepted"

    def _first_time(self, delivery: str) -> bool:
        """Whether the delivery id was not seen within REPLAY_WINDOW; remembers it."""
        with self._lock:
            now = self.clock()
            while self._seen and next(iter(self._seen.values())) <= now - REPLAY_WINDOW:
                self._seen.popitem(last=False)
            if delivery in self._seen:
                return False
            self._seen[delivery] = now
            while len(self._seen) > REMEMBERED_DELIVERIES:
                self._seen.popitem(last=False)
        return True


def signed_payload(headers: Mapping[str, str], body: bytes) -> bytes:
    """The JSON payload Gitea signed: the body, or the `payload` field of a form body
    (`services/webhook/deliver.go`: the form carries `payload=<JSON>`, the signature
    covers the JSON). A form without one gives b"" (its signature cannot match)."""
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return body
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return fields.get("payload", [""])[0].encode("utf-8")


def _delivery_id(headers: Mapping[str, str]) -> str:
    return headers.get("x-gitea-delivery") or headers.get("x-forgejo-delivery") or ""


class _Repository(BaseModel):
    full_name: str = Field(pattern=r"^[^/]+/[^/]+$")


class _Payload(BaseModel):
    """The one field a delivery is read for. pydantic's parser refuses the whole body when
    it is not JSON, nests too deeply or holds a number too long, with a ValidationError
    like any missing field: never an exception nobody expected."""

    repository: _Repository


def _repo_of(body: bytes) -> str | None:
    try:
        return _Payload.model_validate_json(body).repository.full_name
    except ValidationError:
        return None


def register_hook(gitea: GiteaClient, owner: str, url: str, secret: str) -> str:
    """Make sure the owner (the token's user or an org) has a webhook to `url`; returns
    what was done. ForgeError when the token may not manage the owner's hooks."""
    scope = (
        "/user/hooks" if owner.casefold() == gitea.login().casefold() else f"/orgs/{owner}/hooks"
    )
    if any(hook.get("config", {}).get("url") == url for hook in gitea.list_hooks(scope)):
        return f"webhook to {shown_url(url)} already registered on {scope}"
    gitea.add_hook(scope, url, secret, list(EVENTS))
    return f"webhook to {shown_url(url)} registered on {scope}"
