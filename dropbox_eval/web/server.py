"""create_web: the client API plus the operator's view (metrics, health, page) in one app."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from ..errors import DropboxEvalError, answer_for
from .api import create_api
from .collector import StateCollector
from .headers import SecurityHeaders
from .health import Health
from .page import add_operator_page
from .parts import WebParts
from .session import key_matches, operator_key_id
from .throttle import LoginThrottle, trust_proxies

if TYPE_CHECKING:
    from ..config import Settings
    from ..intake.pause import Pause
    from ..store import Store


def create_web(parts: WebParts, service_status: Callable[[], dict[str, Any] | None]) -> FastAPI:
    """The HTTP server's app over the parts it uses. `service_status()` is the running
    service's status, None when none runs (the in-process service inside `run
    --http-port`, the status file for `serve`)."""
    api = create_api(parts)
    health = Health(parts.store, parts.gitea, parts.settings, service_status, parts.node)
    state = CollectorRegistry()  # this app's: the process's own metrics are not touched
    state.register(StateCollector(parts.store, parts.settings, parts.webhooks))

    def scrape() -> bytes:
        """The process's metrics, then those read from the store now."""
        return parts.metrics.render() + generate_latest(state)

    @api.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        token = parts.settings.metrics_token
        if token and not key_matches(_bearer(request), token):
            body = {
                "ok": False,
                "reason": "unauthorized",
                "message": "this /metrics needs Authorization: Bearer <SAAS_EVAL_METRICS_TOKEN>",
            }
            return JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})
        return Response(await run_in_threadpool(scrape), media_type=CONTENT_TYPE_LATEST)

    @api.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @api.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        result = await run_in_threadpool(health.readiness)
        body = {"ok": result.ready, "checks": result.checks} | parts.pause.view()
        if result.nodes:  # nodes sharing a database: each one's heartbeat and leases
            body["nodes"] = result.nodes
        if body["paused"]:  # held on purpose: still ready, and says so
            body["message"] = f"paused since {body['paused_since']}"
        return JSONResponse(body, status_code=200 if result.ready else 503)

    throttle = LoginThrottle()  # one for the page's sign-in and the pause routes' key
    api.state.login_throttle = throttle
    add_operator_page(api, parts, health, throttle)
    add_pause_routes(api, parts.pause, parts.settings, throttle, parts.store)
    api.add_middleware(SecurityHeaders)
    trust_proxies(api, parts.settings.proxies)
    return api


NO_OPERATOR_KEY = "pause and resume need SAAS_EVAL_OPERATOR_KEY set on the service"


class PauseState(BaseModel):
    """The answer of the pause routes."""

    ok: bool
    paused: bool
    paused_since: str | None = Field(None, description="RFC 3339, UTC, whole seconds")
    paused_by: str | None = Field(None, description="cli, api or operator page")
    was_paused_since: str | None = Field(None, description="`resume` only")


class OperatorProblem(BaseModel):
    """An error answer of the operator's routes."""

    ok: bool = False
    reason: str
    message: str


operator_key = HTTPBearer(
    scheme_name="operatorKey",
    description="Authorization: Bearer SAAS_EVAL_OPERATOR_KEY (a client's API key is not "
    "enough); each try counts toward the sign-in throttle",
    auto_error=False,
)
OPERATOR_ROUTE: dict[str, Any] = {
    "tags": ["operator"],
    "dependencies": [Depends(operator_key)],  # documents the key; `refused` checks it
    "response_model": None,
    "responses": {
        200: {"model": PauseState},
        **{
            code: {"model": OperatorProblem}
            for code in (401, 429, 503)  # 503: no operator key is configured
        },
    },
}


def add_pause_routes(
    api: FastAPI, pause: Pause, settings: Settings, throttle: LoginThrottle, store: Store
) -> None:
    """`GET|POST /api/eval/pause`, `POST /api/eval/resume`: the operator's (Bearer
    SAAS_EVAL_OPERATOR_KEY, read from `settings`; a client's API key is not enough), each
    try counted by the sign-in `throttle`; a pause or resume is recorded in the audit log
    of `store`."""

    def recorded(action: str, run: Callable[[], Any]) -> Any:
        """`run()`, recorded as `action` by the operator's key, with its result."""
        key_id = operator_key_id(settings.operator_key)
        try:
            value = run()
        except DropboxEvalError as exc:
            result = answer_for(exc)[2]
            store.record_action(
                action, "-", actor="operator", via="api", key_id=key_id, result=result
            )
            raise
        store.record_action(action, "-", actor="operator", via="api", key_id=key_id)
        return value

    def refused(request: Request) -> JSONResponse | None:
        """None when the operator's key came; the sign-in throttle counts each try, so the
        key cannot be guessed here faster than on the page's sign-in form."""
        if not settings.operator_key:
            body = {"ok": False, "reason": "not_configured", "message": NO_OPERATOR_KEY}
            return JSONResponse(body, 503)
        source = request.client.host if request.client else "-"
        wait = throttle.attempt(source)
        if wait:
            message = f"too many wrong keys from your address: try again in {wait} s"
            body = {"ok": False, "reason": "too_many_attempts", "message": message}
            return JSONResponse(body, 429, headers={"Retry-After": str(wait)})
        if key_matches(_bearer(request), settings.operator_key):
            throttle.succeeded(source)
            return None
        body = {
            "ok": False,
            "reason": "unauthorized",
            "message": "pause and resume need Authorization: Bearer <SAAS_EVAL_OPERATOR_KEY>",
        }
        return JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})

    @api.get("/api/eval/pause", **OPERATOR_ROUTE)
    def paused(request: Request) -> JSONResponse:
        """Whether intake is paused, since when and by whom (the operator's key)."""
        return refused(request) or JSONResponse({"ok": True, **pause.view()})

    @api.post("/api/eval/pause", **OPERATOR_ROUTE)
    def pause_intake(request: Request) -> JSONResponse:
        """Hold intake: files wait in the inbox, forge writes stop; polling and delivery go
        on (the operator's key; docs: Pause and resume)."""
        if (answer := refused(request)) is not None:
            return answer
        recorded("pause", lambda: pause.pause(by="api"))
        return JSONResponse({"ok": True, **pause.view()})

    @api.post("/api/eval/resume", **OPERATOR_ROUTE)
    def resume_intake(request: Request) -> JSONResponse:
        """End the pause (the operator's key); `was_paused_since` says since when."""
        if (answer := refused(request)) is not None:
            return answer
        ended = recorded("resume", pause.resume)
        body = {"ok": True, **pause.view(), "was_paused_since": (ended or {}).get("since")}
        return JSONResponse(body)


def _bearer(request: Request) -> str | None:
    """The credentials of `Authorization: Bearer ...` (as Prometheus' `authorization`
    scrape setting sends them), if any."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None
