"""The API's documentation pages, `/docs` (Swagger UI) and `/redoc`, served with no
internet: their scripts and stylesheets come from the `fastapi-offline` package's copy of
the Swagger UI and ReDoc bundles, at `/docs/assets/`, instead of FastAPI's default CDN.
Service hosts often reach no CDN; a blank `/docs` was the result."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"
BUNDLES = Path(str(files("fastapi_offline").joinpath("static")))
"""swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js and favicon.png."""


def add_offline_docs(api: FastAPI) -> None:
    """Serve `/docs` and `/redoc` from the packaged bundles (create `api` with
    `docs_url=None, redoc_url=None`, so FastAPI's CDN pages are not mounted)."""
    api.mount(ASSETS, StaticFiles(directory=BUNDLES), name="docs-assets")

    @api.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{api.openapi_url}",
            title=f"{api.title} - API",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # no badge from another site
        )

    @api.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{api.openapi_url}",
            title=f"{api.title} - API",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
