"""Webhooks of the sandbox forge, sent the way Gitea sends them.

Hooks are registered per repo, per org or per user (`/repos/{o}/{r}/hooks`,
`/orgs/{org}/hooks`, `/user/hooks`); an owner's hook fires for all of its repos. Each
delivery is a POST with Gitea's headers (`X-Gitea-Event`, `X-Gitea-Event-Type`,
`X-Gitea-Delivery`, `X-Gitea-Signature` = hex HMAC-SHA256 of the JSON payload with the
hook's secret, the same as `X-Forgejo-*`, `X-Gogs-*` and `X-Hub-Signature-256: sha256=...`)
and the payload shapes of Gitea's `IssuePayload`, `IssueCommentPayload` and
`PullRequestPayload`. A hook with the `form` content type gets `payload=<urlencoded JSON>`,
still signed over the JSON (Gitea's `services/webhook/deliver.go`, `Deliver`). Deliveries
leave from one background thread, in order, after the change is made; a failed delivery is
recorded and not retried (Gitea retries only by hand). A payload is built only when a hook
wants the event, so a change without hooks costs nothing here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import requests

if TYPE_CHECKING:
    from .models import JSON, Account, Issue, Repo

# the hook event a client subscribes to -> the event types it covers
SUBSCRIPTIONS = {
    "issues": {"issues", "issue_label"},
    "issue_label": {"issue_label"},
    "issue_comment": {"issue_comment"},
    "pull_request": {"pull_request"},
}
DELIVERY_TIMEOUT = 5.0


@dataclass
class Hook:
    """One registered webhook."""

    id: int
    scope: str  # "repo:owner/name", "owner:login"
    url: str
    secret: str
    events: list[str]
    active: bool = True
    created: float = field(default_factory=time.time)
    content_type: str = "json"  # or "form"

    def wants(self, event_type: str) -> bool:
        """Whether this hook subscribes to `event_type`."""
        return self.active and any(event_type in SUBSCRIPTIONS.get(e, {e}) for e in self.events)

    def to_json(self) -> JSON:
        """Render as Gitea's Hook object (the secret is never returned)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
        return {
            "id": self.id,
            "type": "gitea",
            "branch_filter": "",
            "events": self.events,
            "active": self.active,
            "authorization_header": "",
            "created_at": stamp,
            "updated_at": stamp,
            "config": {"url": self.url, "content_type": self.content_type},
        }


@dataclass(frozen=True)
class Delivery:
    """One delivery as it was sent."""

    hook_id: int
    event_type: str
    delivery_id: str
    status: int | None
    error: str = ""


class HookRegistry:
    """Registered hooks and the sender thread (all methods are thread-safe)."""

    def __init__(self, base_url: str = "") -> None:
        self.base_url = base_url
        self._hooks: dict[int, Hook] = {}
        self._ids = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[Hook, str, bytes]] = queue.Queue()
        self.deliveries: list[Delivery] = []
        self._thread: threading.Thread | None = None
        self._pending = 0  # queued and not sent yet
        self._idle = threading.Condition()

    def add(
        self, scope: str, url: str, secret: str, events: list[str], content_type: str = "json"
    ) -> Hook:
        """Register a hook (`scope` is `repo:o/r` or `owner:login`)."""
        with self._lock:
            hook = Hook(next(self._ids), scope, url, secret, events or ["push"])
            hook.content_type = content_type
            self._hooks[hook.id] = hook
        return hook

    def listed(self, scope: str) -> list[Hook]:
        """The hooks of one scope."""
        with self._lock:
            return [h for h in self._hooks.values() if h.scope == scope.lower()]

    def rescope(self, old: str, new: str) -> None:
        """A repo's hooks follow it to its new `owner/name` (Gitea keys them by repo id)."""
        with self._lock:
            for hook in self._hooks.values():
                if hook.scope == old.lower():
                    hook.scope = new.lower()

    def remove(self, scope: str, hook_id: int) -> bool:
        """Delete a hook of `scope`; False when there is none with that id."""
        with self._lock:
            hook = self._hooks.get(hook_id)
            if hook is None or hook.scope != scope.lower():
                return False
            del self._hooks[hook_id]
            return True

    def notify(self, event_type: str, repo: Repo, payload: Callable[[], JSON]) -> None:
        """Queue a delivery to every hook of the repo or its owner that wants the event;
        `payload` is called only then."""
        if not self._hooks:
            return
        scopes = {f"repo:{repo.full_name}".lower(), f"owner:{repo.owner.login}".lower()}
        with self._lock:
            hooks = [h for h in self._hooks.values() if h.scope in scopes and h.wants(event_type)]
        if not hooks:
            return
        body = json.dumps(payload()).encode()
        with self._idle:
            self._pending += len(hooks)
        for hook in hooks:
            self._queue.put((hook, event_type, body))
        self._ensure_sender()

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every delivery queued so far was sent (answered or failed); False
        on timeout (tests step a history and let each change's deliveries land)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _ensure_sender(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._send_all, name="sandbox-hooks", daemon=True
                )
                self._thread.start()

    def _send_all(self) -> None:
        while True:
            try:
                hook, event_type, body = self._queue.get(timeout=5.0)
            except queue.Empty:
                with self._lock:  # a delivery queued meanwhile keeps this thread going
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            self.deliveries.append(send(hook, event_type, body))
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


def headers_for(
    event_type: str, delivery_id: str, body: bytes, secret: str, content_type: str = "json"
) -> dict[str, str]:
    """Gitea's webhook headers (and Forgejo's, Gogs' and GitHub's aliases); `body` is the
    JSON payload, which the signature covers whatever the content type."""
    event = "issues" if event_type == "issue_label" else event_type
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest() if secret else ""
    form = content_type == "form"
    kind = "application/x-www-form-urlencoded" if form else "application/json"
    headers = {"Content-Type": kind, "User-Agent": "Go-http-client/1.1"}
    for prefix in ("X-Gitea", "X-Forgejo", "X-Gogs", "X-GitHub"):
        headers[f"{prefix}-Delivery"] = delivery_id
        headers[f"{prefix}-Event"] = event
        headers[f"{prefix}-Event-Type"] = event_type
        if signature and prefix != "X-GitHub":
            headers[f"{prefix}-Signature"] = signature
    if signature:
        headers["X-Hub-Signature-256"] = f"sha256={signature}"
    return headers


def send(hook: Hook, event_type: str, body: bytes) -> Delivery:
    """POST one delivery; its outcome (never raises)."""
    delivery_id = str(uuid.uuid4())
    headers = headers_for(event_type, delivery_id, body, hook.secret, hook.content_type)
    sent = urlencode({"payload": body.decode()}).encode() if hook.content_type == "form" else body
    try:
        answer = requests.post(hook.url, data=sent, headers=headers, timeout=DELIVERY_TIMEOUT)
    except requests.RequestException as exc:
        return Delivery(hook.id, event_type, delivery_id, None, str(exc))
    return Delivery(hook.id, event_type, delivery_id, answer.status_code)


def issue_payload(action: str, issue: Issue, sender: Account, base_url: str) -> JSON:
    """Gitea's IssuePayload (or PullRequestPayload for a pull request)."""
    from .pullrequest import pull_json

    repo = issue.repo.to_json(base_url)
    if issue.is_pull:
        return {
            "action": action,
            "number": issue.number,
            "pull_request": pull_json(issue, base_url),
            "repository": repo,
            "sender": sender.to_json(),
            "commit_id": "",
        }
    return {
        "action": action,
        "number": issue.number,
        "changes": None,
        "issue": issue.to_json(base_url),
        "repository": repo,
        "sender": sender.to_json(),
        "commit_id": "",
    }


def comment_payload(
    issue: Issue, comment: JSON, sender: Account, base_url: str, action: str = "created"
) -> JSON:
    """Gitea's IssueCommentPayload for a new (or edited) comment."""
    return {
        "action": action,
        "issue": issue.to_json(base_url),
        "pull_request": None,
        "comment": comment,
        "changes": None,
        "repository": issue.repo.to_json(base_url),
        "sender": sender.to_json(),
        "is_pull": issue.is_pull,
    }
