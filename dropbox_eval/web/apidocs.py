"""The API's documentation pages, `/docs` (Swagger UI) and `/redoc`, served with no
internet: their scripts and stylesheets come from the `fastapi-offline` package's copy of
the Swagger UI and ReDoc bundles, at `/docs/assets/`, instead of FastAPI's default CDN.
Service hosts often reach no CDN; a blank `/docs` was the result.

Both render descriptions as Markdown, where `inbox/<client_id>/` is an HTML tag that
vanishes (`inbox//`): the OpenAPI document they read has every `<...>` outside code spans
escaped (`escape_markup`), while the models' own text (and the JSON Schemas made from it)
stays as written."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path
from typing import Any

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
    generate = api.openapi
    escaped: list[bool] = []

    def openapi() -> dict[str, Any]:
        """FastAPI's document (made once), its text escaped once."""
        document = generate()
        if not escaped:
            escape_markup(document)
            escaped.append(True)
        return document

    api.openapi = openapi  # type: ignore[method-assign]

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


_TAG_RE = re.compile(r"<([^<>`\n]*)>")
_TEXT_KEYS = frozenset({"description", "summary", "title"})


def escape_markup(document: Any) -> None:
    """Escape `<...>` in every description, summary and title of an OpenAPI document, in
    place, except inside code spans (Markdown shows those as written)."""
    if isinstance(document, list):
        for item in document:
            escape_markup(item)
    if not isinstance(document, dict):
        return
    for key, value in document.items():
        if key in _TEXT_KEYS and isinstance(value, str):
            document[key] = escaped_text(value)
        else:
            escape_markup(value)


def escaped_text(text: str) -> str:
    """`text` with `<x>` as `&lt;x&gt;` outside `code spans`."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[index] = _TAG_RE.sub(r"&lt;\1&gt;", parts[index])
    return "`".join(parts)
