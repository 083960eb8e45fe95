"""Routes: webhooks of a repo, an org or the user; the cross-repo searches; users."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .errors import SandboxApiError, SandboxNotFound
from .query import ISSUE_PAGING_NUM, page_size
from .routes_issues import issue_query
from .schemas import CreateHookOption
from .web import body, forge, index, int_param, login, paged_reply, reply, total_headers

router = APIRouter(prefix="/api/v1")


@router.get("/repos/issues/search")
async def search_issues(request: Request) -> JSONResponse:
    """Gitea's `SearchIssues`: issues of every repo (of `owner`, if given; 400 when unknown),
    newest first, 20 a page by default (`UI.IssuePagingNum`), with `Link`; labels are ORed
    across the instance, and changes newer than the indexer lag are not seen yet."""
    query = issue_query(request, ISSUE_PAGING_NUM)
    items, total = forge(request).search_issues(request.query_params.get("owner"), query)
    return paged_reply(request, items, total, query.page, query.limit)


async def _add(request: Request, scope: str) -> JSONResponse:
    opt = await body(request, CreateHookOption)
    if opt.type not in ("gitea", "gogs", "forgejo"):
        raise SandboxApiError(422, f"Invalid hook type: {opt.type}")
    if opt.config.content_type not in ("json", "form"):  # Gitea's IsValidHookContentType
        raise SandboxApiError(422, "Invalid content type")
    config = opt.config
    hook = forge(request).hooks.add(
        scope, config.url, config.secret, opt.events or [], config.content_type
    )
    hook.active = opt.active
    return reply(hook.to_json(), 201)


def _listed(request: Request, scope: str) -> JSONResponse:
    return reply([h.to_json() for h in forge(request).hooks.listed(scope)])


def _removed(request: Request, scope: str, hook_id: str) -> Response:
    if not forge(request).hooks.remove(scope, index(hook_id)):
        raise SandboxNotFound()
    return Response(status_code=204)


def _repo_scope(request: Request, owner: str, repo: str) -> str:
    forge(request).get_repo(owner, repo)  # 404 when unknown
    return f"repo:{owner}/{repo}".lower()


def _org_scope(request: Request, org: str) -> str:
    if not forge(request).is_org(org):
        raise SandboxNotFound()
    return f"owner:{org}".lower()


@router.post("/repos/{owner}/{repo}/hooks")
async def add_repo_hook(request: Request, owner: str, repo: str) -> JSONResponse:
    """Register a repo webhook."""
    return await _add(request, _repo_scope(request, owner, repo))


@router.get("/repos/{owner}/{repo}/hooks")
async def repo_hooks(request: Request, owner: str, repo: str) -> JSONResponse:
    """The repo's webhooks."""
    return _listed(request, _repo_scope(request, owner, repo))


@router.delete("/repos/{owner}/{repo}/hooks/{hook_id}")
async def remove_repo_hook(request: Request, owner: str, repo: str, hook_id: str) -> Response:
    """Delete a repo webhook."""
    return _removed(request, _repo_scope(request, owner, repo), hook_id)


@router.post("/orgs/{org}/hooks")
async def add_org_hook(request: Request, org: str) -> JSONResponse:
    """Register an org webhook (fires for every repo of the org)."""
    return await _add(request, _org_scope(request, org))


@router.get("/orgs/{org}/hooks")
async def org_hooks(request: Request, org: str) -> JSONResponse:
    """The org's webhooks."""
    return _listed(request, _org_scope(request, org))


@router.delete("/orgs/{org}/hooks/{hook_id}")
async def remove_org_hook(request: Request, org: str, hook_id: str) -> Response:
    """Delete an org webhook."""
    return _removed(request, _org_scope(request, org), hook_id)


@router.post("/user/hooks")
async def add_user_hook(request: Request) -> JSONResponse:
    """Register a webhook of the user (fires for every repo the user owns)."""
    return await _add(request, f"owner:{login(request)}".lower())


@router.get("/user/hooks")
async def user_hooks(request: Request) -> JSONResponse:
    """The user's webhooks."""
    return _listed(request, f"owner:{login(request)}".lower())


@router.delete("/user/hooks/{hook_id}")
async def remove_user_hook(request: Request, hook_id: str) -> Response:
    """Delete a webhook of the user."""
    return _removed(request, f"owner:{login(request)}".lower(), hook_id)


@router.get("/users/{username}")
async def get_user(request: Request, username: str) -> JSONResponse:
    """A user or an organization by name (404 when unknown)."""
    return reply(forge(request).user_json(username))


@router.get("/repos/search")
async def search_repos(request: Request) -> JSONResponse:
    """Repos owned by account `uid`, with `open_issues_count`, like Gitea's
    `{"ok": true, "data": [...]}` answer (paged, `X-Total-Count`)."""
    uid = int_param(request, "uid")
    page = max(1, int_param(request, "page") or 1)
    limit = page_size(int_param(request, "limit"))
    repos = forge(request).repos_of(uid)
    chosen = repos[(page - 1) * limit : page * limit]
    return reply({"ok": True, "data": chosen}, headers=total_headers(len(repos)))
