"""Routes: pull requests (create, list, get, edit, merge) and the issue timeline."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .errors import SandboxApiError, SandboxNotFound
from .query import parse_time
from .schemas import CreatePullRequestOption, EditPullRequestOption, MergePullRequestOption
from .state_pulls import MERGE_STYLES
from .web import body, forge, index, int_param, login, paged_reply, reply, total_headers

router = APIRouter(prefix="/api/v1/repos/{owner}/{repo}")


@router.get("/pulls")
async def list_pulls(request: Request, owner: str, repo: str) -> JSONResponse:
    """PRs newest first (`state` open|closed|all), always paged, with Link and total."""
    state = request.query_params.get("state", "open")
    page = max(1, int_param(request, "page") or 1)
    items, total, size = forge(request).list_pulls(
        owner,
        repo,
        state=state if state in ("closed", "all") else "open",
        page=page,
        limit=int_param(request, "limit"),
    )
    return paged_reply(request, items, total, page, size)


@router.post("/pulls")
async def create_pull(request: Request, owner: str, repo: str) -> JSONResponse:
    """Open a PR; `Closes #N` in its body adds a `pull_ref` event on issue N."""
    opt = await body(request, CreatePullRequestOption)
    pull = forge(request).create_pull(
        owner,
        repo,
        login(request),
        head=opt.head,
        base=opt.base,
        title=opt.title,
        body=opt.body or "",
    )
    return reply(pull, 201)


@router.get("/pulls/{number}")
async def get_pull(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """One PR (404 for a plain issue)."""
    return reply(forge(request).get_pull(owner, repo, index(number)))


@router.patch("/pulls/{number}")
async def edit_pull(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """Edit a PR; `{"state": "closed"}` closes it unmerged. Answers 201 like Gitea."""
    opt = await body(request, EditPullRequestOption)
    pull = forge(request).edit_pull(
        owner,
        repo,
        index(number),
        login(request),
        title=opt.title,
        body=opt.body,
        state=opt.state,
    )
    return reply(pull, 201)


@router.get("/pulls/{number}/merge")
async def is_merged(request: Request, owner: str, repo: str, number: str) -> Response:
    """204 if merged, 404 if not."""
    if not forge(request).is_merged(owner, repo, index(number)):
        raise SandboxNotFound()
    return Response(status_code=204)


@router.post("/pulls/{number}/merge")
async def merge_pull(request: Request, owner: str, repo: str, number: str) -> Response:
    """Merge (200, empty body); 405 if merged already, 404 if closed."""
    opt = await body(request, MergePullRequestOption)
    if not opt.do:
        raise SandboxApiError(422, "[Do]: Required")
    if opt.do not in MERGE_STYLES:
        raise SandboxApiError(422, "[Do]: In")
    forge(request).merge_pull(owner, repo, index(number), login(request))
    return Response(status_code=200)


@router.get("/issues/{number}/timeline")
async def timeline(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """Comments and events; all unless `page` >= 1. X-Total-Count counts this page only
    and there is no Link header: both as Gitea's `ListIssueCommentsAndTimeline` does."""
    state = forge(request)
    params = request.query_params
    quirk = state.flavor.missing_issue_status == 500
    items = state.timeline(
        owner,
        repo,
        index(number, quirk_500=quirk),
        since=parse_time(params.get("since")),
        before=parse_time(params.get("before")),
        page=int_param(request, "page"),
        limit=int_param(request, "limit"),
        caller=login(request),
    )
    return reply(items, headers=total_headers(len(items)))
