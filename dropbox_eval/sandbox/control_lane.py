"""Unauthenticated `/_sandbox/lane` control routes: settings, holds, and a manual step."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .errors import SandboxApiError
from .lane import SimulatedLane
from .web import reply

router = APIRouter(prefix="/_sandbox/lane")


class HoldOption(BaseModel):
    """Body of `POST /_sandbox/lane/hold|release`: no owner/repo means everyone."""

    owner: str | None = None
    repo: str | None = None
    number: int | None = None


def _lane(request: Request) -> SimulatedLane:
    lane: SimulatedLane | None = request.app.state.lane
    if lane is None:
        raise SandboxApiError(409, "this sandbox runs without a lane")
    return lane


def _describe(lane: SimulatedLane) -> JSONResponse:
    return reply({"config": lane.config.to_json(), "holds": lane.gate.to_json()})


@router.get("")
async def show(request: Request) -> JSONResponse:
    """Current lane settings and holds."""
    return _describe(_lane(request))


@router.patch("")
async def configure(request: Request, changes: dict[str, Any]) -> JSONResponse:
    """Change lane settings (`mode`, `delay`, `merge_ratio`, `close_first`, ...)."""
    lane = _lane(request)
    try:
        lane.configure(**changes)
    except (TypeError, ValueError) as exc:
        raise SandboxApiError(422, str(exc)) from None
    return _describe(lane)


@router.post("/hold")
async def hold(request: Request, opt: HoldOption) -> JSONResponse:
    """Keep the lane off one issue, one repo, or everything."""
    lane = _lane(request)
    lane.gate.hold(opt.owner, opt.repo, opt.number)
    return _describe(lane)


@router.post("/release")
async def release(request: Request, opt: HoldOption) -> JSONResponse:
    """Let the lane work on one issue, one repo, or everything."""
    lane = _lane(request)
    lane.gate.release(opt.owner, opt.repo, opt.number)
    return _describe(lane)


@router.post("/run")
async def run(request: Request) -> JSONResponse:
    """Do now whatever is due now; answers `{"actions": n}`."""
    return reply({"actions": _lane(request).run_once()})
