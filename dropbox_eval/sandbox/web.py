"""Small helpers shared by the sandbox route modules."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .errors import SandboxApiError, SandboxNotFound
from .middleware import USER_KEY
from .query import page_links
from .schemas import parse_body
from .state import ForgeState

M = TypeVar("M", bound=BaseModel)
EXPOSE = "Link, X-Total-Count"


def forge(request: Request) -> ForgeState:
    """The ForgeState served by this app."""
    state: ForgeState = request.app.state.forge
    return state


def login(request: Request) -> str:
    """Login of the authenticated caller (set by the middleware)."""
    return str(request.scope[USER_KEY])


async def body(request: Request, model: type[M]) -> M:
    """Parse the JSON body into `model`, answering Gitea-style 422s."""
    return parse_body(model, await request.body())


def reply(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    """JSON response without FastAPI's encoder pass."""
    return JSONResponse(content, status_code=status, headers=headers)


def total_headers(total: int) -> dict[str, str]:
    """`X-Total-Count` plus the CORS exposure Gitea sends."""
    return {"X-Total-Count": str(total), "Access-Control-Expose-Headers": EXPOSE}


def paged_reply(
    request: Request, items: list[Any], total: int, page: int, limit: int
) -> JSONResponse:
    """Reply with a page plus `X-Total-Count` and Gitea's `Link` header."""
    headers = total_headers(total)
    base = f"{forge(request).base_url}{request.url.path}"
    links = page_links(base, list(request.query_params.multi_items()), page, limit, total)
    if links:
        headers["Link"] = links
    return reply(items, headers=headers)


def int_param(request: Request, name: str) -> int | None:
    """An integer query parameter; absent or unparsable -> None (Gitea reads 0)."""
    raw = request.query_params.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def index(raw: str, *, quirk_500: bool = False) -> int:
    """Parse an issue index path segment; garbage behaves like a missing issue."""
    if raw.isdigit():
        return int(raw)
    if quirk_500:
        raise SandboxApiError(500, "GetRawIssueByIndex")
    raise SandboxNotFound()
