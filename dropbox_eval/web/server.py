"""create_web: the client API plus the operator's view (metrics, health, page) in one app."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from .api import create_api
from .collector import StateCollector
from .headers import SecurityHeaders
from .health import Health
from .page import add_operator_page
from .session import key_matches

if TYPE_CHECKING:
    from ..app import App


def create_web(app: App, service_status: Callable[[], dict[str, Any] | None]) -> FastAPI:
    """The HTTP server's app. `service_status()` is the running service's status, None
    when none runs (the in-process service inside `run --http-port`, the status file for
    `serve`)."""
    api = create_api(app)
    health = Health(app, service_status)
    app.metrics.watch_state(StateCollector(app))

    @api.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        token = app.settings.metrics_token
        if token and not key_matches(_bearer(request), token):
            body = {
                "ok": False,
                "reason": "unauthorized",
                "message": "this /metrics needs Authorization: Bearer <SAAS_EVAL_METRICS_TOKEN>",
            }
            return JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})
        return Response(await run_in_threadpool(app.metrics.render), media_type=CONTENT_TYPE_LATEST)

    @api.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @api.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        result = await run_in_threadpool(health.readiness)
        body = {"ok": result.ready, "checks": result.checks} | app.pause.view()
        if body["paused"]:  # held on purpose: still ready, and says so
            body["message"] = f"paused since {body['paused_since']}"
        return JSONResponse(body, status_code=200 if result.ready else 503)

    add_operator_page(api, app, health)  # first: its sign-in throttle guards the pause too
    add_pause_routes(api, app)
    api.add_middleware(SecurityHeaders)
    return api


NO_OPERATOR_KEY = "pause and resume need SAAS_EVAL_OPERATOR_KEY set on the service"


def add_pause_routes(api: FastAPI, app: App) -> None:
    """`GET|POST /api/eval/pause`, `POST /api/eval/resume`: the operator's (Bearer
    SAAS_EVAL_OPERATOR_KEY; a client's API key is not enough)."""

    def refused(request: Request) -> JSONResponse | None:
        """None when the operator's key came; the sign-in throttle counts each try, so the
        key cannot be guessed here faster than on the page's sign-in form."""
        if not app.settings.operator_key:
            body = {"ok": False, "reason": "not_configured", "message": NO_OPERATOR_KEY}
            return JSONResponse(body, 503)
        throttle = api.state.login_throttle
        source = request.client.host if request.client else "-"
        wait = throttle.attempt(source)
        if wait:
            message = f"too many wrong keys from your address: try again in {wait} s"
            body = {"ok": False, "reason": "too_many_attempts", "message": message}
            return JSONResponse(body, 429, headers={"Retry-After": str(wait)})
        if key_matches(_bearer(request), app.settings.operator_key):
            throttle.succeeded(source)
            return None
        body = {
            "ok": False,
            "reason": "unauthorized",
            "message": "pause and resume need Authorization: Bearer <SAAS_EVAL_OPERATOR_KEY>",
        }
        return JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})

    @api.get("/api/eval/pause", include_in_schema=False)
    def paused(request: Request) -> JSONResponse:
        return refused(request) or JSONResponse({"ok": True, **app.pause.view()})

    @api.post("/api/eval/pause", include_in_schema=False)
    def pause(request: Request) -> JSONResponse:
        if (answer := refused(request)) is not None:
            return answer
        app.pause.pause(by="api")
        return JSONResponse({"ok": True, **app.pause.view()})

    @api.post("/api/eval/resume", include_in_schema=False)
    def resume(request: Request) -> JSONResponse:
        if (answer := refused(request)) is not None:
            return answer
        ended = app.pause.resume()
        body = {"ok": True, **app.pause.view(), "was_paused_since": (ended or {}).get("since")}
        return JSONResponse(body)


def _bearer(request: Request) -> str | None:
    """The credentials of `Authorization: Bearer ...` (as Prometheus' `authorization`
    scrape setting sends them), if any."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None
