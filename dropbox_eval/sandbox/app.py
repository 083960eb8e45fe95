"""FastAPI application of the sandbox forge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from . import control, control_lane, routes_hooks, routes_issues, routes_pulls, routes_repos
from .errors import SandboxApiError, error_body
from .middleware import ApiMiddleware
from .schemas import gitea_message
from .state import ForgeState

if TYPE_CHECKING:
    from .lane import SimulatedLane


def create_app(state: ForgeState, lane: SimulatedLane | None = None) -> FastAPI:
    """Build the Gitea-compatible app serving `state` (and controlling `lane`, if any)."""
    app = FastAPI(
        title="dropbox-eval sandbox forge", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.forge = state
    app.state.lane = lane
    app.include_router(routes_hooks.router)  # before /repos/{owner}/{repo}: issues/search
    app.include_router(routes_issues.router)
    app.include_router(routes_pulls.router)
    app.include_router(routes_repos.router)
    app.include_router(control.router)
    app.include_router(control_lane.router)
    app.add_middleware(ApiMiddleware, state=state)

    def error(status: int, message: str, extra: dict[str, object] | None = None) -> JSONResponse:
        body = error_body(status, message, state.base_url, extra)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(SandboxApiError)
    async def forge_error(_: Request, exc: SandboxApiError) -> Response:
        if exc.bare:
            return Response(status_code=exc.status)
        return error(exc.status, exc.message, exc.extra)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, "not found" if exc.status_code == 404 else str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, gitea_message("Option", exc.errors()))

    return app
