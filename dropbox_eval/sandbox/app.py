"""FastAPI application of the sandbox forge."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import control, routes_issues, routes_repos
from .errors import ForgeError, error_body
from .middleware import ApiMiddleware
from .schemas import gitea_message
from .state import ForgeState


def create_app(state: ForgeState) -> FastAPI:
    """Build the Gitea-compatible app serving `state`."""
    app = FastAPI(title="dropbox-eval sandbox forge", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.forge = state
    app.include_router(routes_issues.router)  # hot path first: fewer route matches
    app.include_router(routes_repos.router)
    app.include_router(control.router)
    app.add_middleware(ApiMiddleware, state=state)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(error_body(status, message, state.base_url), status_code=status)

    @app.exception_handler(ForgeError)
    async def forge_error(_: Request, exc: ForgeError) -> JSONResponse:
        return error(exc.status, exc.message)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, "not found" if exc.status_code == 404 else str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, gitea_message("Option", exc.errors()))

    return app
