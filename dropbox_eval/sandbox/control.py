"""Unauthenticated `/_sandbox` control routes: fault injection, the search index's lag and
the request log."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .web import forge, reply

router = APIRouter(prefix="/_sandbox")


class FaultsOption(BaseModel):
    """Body of `POST /_sandbox/faults`."""

    count: int = 1
    status: int = 503
    retry_after: int | None = None
    path_contains: str = ""
    method: str = ""


class DelayOption(BaseModel):
    """Body of `POST /_sandbox/delay` and `POST /_sandbox/index_lag`."""

    seconds: float = 0.0


class FailForOption(BaseModel):
    """Body of `POST /_sandbox/fail_for`."""

    seconds: float = 0.0
    status: int = 503


@router.post("/faults")
async def add_faults(request: Request, opt: FaultsOption) -> JSONResponse:
    """Fail the next `count` matching API requests."""
    forge(request).faults.fail_next(
        opt.count,
        opt.status,
        retry_after=opt.retry_after,
        path_contains=opt.path_contains,
        method=opt.method,
    )
    return reply({"ok": True})


@router.delete("/faults")
async def clear_faults(request: Request) -> JSONResponse:
    """Drop pending faults, the failure window and the delay."""
    forge(request).faults.clear()
    return reply({"ok": True})


@router.post("/delay")
async def set_delay(request: Request, opt: DelayOption) -> JSONResponse:
    """Delay every API request by `seconds`."""
    forge(request).faults.delay = max(0.0, opt.seconds)
    return reply({"ok": True})


@router.post("/fail_for")
async def fail_for(request: Request, opt: FailForOption) -> JSONResponse:
    """Fail every API request for the next `seconds`."""
    forge(request).faults.fail_for(opt.seconds, opt.status)
    return reply({"ok": True})


@router.post("/index_lag")
async def set_index_lag(request: Request, opt: DelayOption) -> JSONResponse:
    """`/repos/issues/search` matches issues as they stood `seconds` ago (0: current)."""
    forge(request).indexer_lag = max(0.0, opt.seconds)
    return reply({"ok": True, "seconds": forge(request).indexer_lag})


@router.get("/requests")
async def list_requests(request: Request) -> JSONResponse:
    """The API request log, oldest first: answered requests, or with `?phase=started`
    every request as it arrived (before delay, faults, auth and handler); with
    `?path_contains=`, only the requests whose path contains it."""
    log = forge(request).log
    started = request.query_params.get("phase") == "started"
    part = request.query_params.get("path_contains", "")
    entries = log.started() if started else log.entries()
    return reply([entry.to_json() for entry in entries if part in entry.path])


@router.delete("/requests")
async def clear_requests(request: Request) -> JSONResponse:
    """Forget the API request log."""
    forge(request).log.clear()
    return reply({"ok": True})
