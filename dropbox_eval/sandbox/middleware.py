"""ASGI middleware for `/api/v1`: capacity, delay, fault injection, token auth, renamed
repos' redirects and request logging."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from email.utils import formatdate

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body
from .faults import Fault, RequestLogEntry, RequestStart
from .state import ForgeState

API_PREFIX = "/api/v1"
PUBLIC_PATHS = frozenset({"/api/v1/version"})
USER_KEY = "sandbox_user"
_REPO_PATH = re.compile(r"^/api/v1/repos/([^/]+)/([^/]+)(?:/|$)")


class ApiMiddleware:
    """Wraps the app; every `/api/v1` request is logged, whatever answered it."""

    def __init__(self, app: ASGIApp, state: ForgeState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection scope."""
        path: str = scope.get("path", "")
        if scope["type"] == "http":
            send = _dated(send, self.state.now)
        if scope["type"] != "http" or not _is_api(path):
            await self.app(scope, receive, send)
            return
        query = scope.get("query_string", b"").decode("latin-1")
        self.state.log.begin(RequestStart(scope["method"], path, query))
        logged = False

        def record(status: int) -> None:
            nonlocal logged
            if not logged:
                logged = True
                self.state.log.append(RequestLogEntry(scope["method"], path, status, query))

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record(message["status"])  # before the client can see the answer
            await send(message)

        try:
            async with self.state.faults.capacity.slot():  # queued before the delay
                await self._serve(scope, receive, logged_send, path)
        except ClientDisconnect:
            record(499)  # the client went away mid-request (killed); nothing to answer
        finally:
            record(500)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        faults = self.state.faults
        if faults.delay > 0:
            await asyncio.sleep(faults.delay)
        fault = faults.take(path, scope["method"])
        if fault is not None:
            await _reply_fault(send, fault)
            return
        if path not in PUBLIC_PATHS:
            login, problem = self._authenticate(scope)
            if login is None:
                await _reply(send, 401, error_body(401, problem, self.state.base_url))
                return
            scope[USER_KEY] = login
        location = self._moved(scope, path)
        if location is not None:
            await _redirect(send, self.state.redirect_status, location)
            return
        await self.app(scope, receive, send)

    def _moved(self, scope: Scope, path: str) -> str | None:
        """Gitea's `RedirectToRepo` for a renamed repo's old path: the same path (and query)
        under the new `owner/name`, for every method."""
        match = _REPO_PATH.match(path)
        moved = self.state.moved_to(match.group(1), match.group(2)) if match else None
        if match is None or moved is None:
            return None
        old = f"{match.group(1)}/{match.group(2)}"
        raw = scope.get("raw_path") or path.encode()
        location = raw.decode("latin-1").replace(old, moved, 1)
        query = scope.get("query_string", b"").decode("latin-1")
        return f"{location}?{query}" if query else location

    def _authenticate(self, scope: Scope) -> tuple[str | None, str]:
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        parts = header.decode("latin-1").split()
        if len(parts) != 2 or not self.state.flavor.accepts_scheme(parts[0]):
            return None, "token is required"
        login = self.state.login_for_token(parts[1])
        return login, "user does not exist [uid: 0, name: ]"


def _dated(send: Send, clock: Callable[[], float]) -> Send:
    """Adds `Date` from the forge's clock at the moment of answering, as Gitea's Go server
    does (the forge's clock is what `since` and settling are measured against)."""

    async def dated_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            stamp = formatdate(clock(), usegmt=True).encode("latin-1")
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"date"]
            message = {**message, "headers": [*headers, (b"date", stamp)]}
        await send(message)

    return dated_send


def _is_api(path: str) -> bool:
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


async def _redirect(send: Send, status: int, location: str) -> None:
    headers = [(b"location", location.encode("latin-1")), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _reply_fault(send: Send, fault: Fault) -> None:
    extra = [] if fault.retry_after is None else [(b"retry-after", str(fault.retry_after).encode())]
    await _reply(send, fault.status, {"message": "sandbox fault"}, extra)


async def _reply(
    send: Send, status: int, body: dict[str, object], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json;charset=utf-8"),
        (b"content-length", str(len(payload)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
