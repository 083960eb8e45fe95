"""Routes: version, user, settings, repositories and repo labels."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .query import DEFAULT_PAGING_NUM, MAX_RESPONSE_ITEMS
from .schemas import (
    CreateLabelOption,
    CreateRepoOption,
    EditLabelOption,
    EditRepoOption,
    TransferRepoOption,
)
from .web import body, forge, index, int_param, login, reply, total_headers

router = APIRouter(prefix="/api/v1")


@router.get("/version")
async def version(request: Request) -> JSONResponse:
    """Server version (no auth); Forgejo-style `X+gitea-1.22.0` on the Forgejo flavour."""
    return reply({"version": forge(request).flavor.version})


@router.get("/user")
async def current_user(request: Request) -> JSONResponse:
    """The authenticated user."""
    return reply(forge(request).user_json(login(request)))


@router.get("/settings/api")
async def api_settings() -> JSONResponse:
    """Paging limits, like Gitea's defaults."""
    return reply(
        {
            "max_response_items": MAX_RESPONSE_ITEMS,
            "default_paging_num": DEFAULT_PAGING_NUM,
            "default_git_trees_per_page": 1000,
            "default_max_blob_size": 10485760,
        }
    )


async def _create_repo(request: Request, owner: str, *, org_only: bool) -> JSONResponse:
    opt = await body(request, CreateRepoOption)
    repo = forge(request).create_repo(
        owner,
        opt.name,
        description=opt.description or "",
        private=bool(opt.private),
        auto_init=bool(opt.auto_init),
        org_only=org_only,
    )
    return reply(repo, 201)


@router.post("/user/repos")
async def create_user_repo(request: Request) -> JSONResponse:
    """Create a repo for the authenticated user."""
    return await _create_repo(request, login(request), org_only=False)


@router.post("/orgs/{org}/repos")
async def create_org_repo(request: Request, org: str) -> JSONResponse:
    """Create a repo in an organization (404 if the org is unknown)."""
    return await _create_repo(request, org, org_only=True)


@router.get("/repos/{owner}/{repo}")
async def get_repo(request: Request, owner: str, repo: str) -> JSONResponse:
    """One repository."""
    return reply(forge(request).get_repo(owner, repo))


@router.patch("/repos/{owner}/{repo}")
async def edit_repo(request: Request, owner: str, repo: str) -> JSONResponse:
    """Gitea's `EditRepo`: rename (the old name then redirects) or archive; 200."""
    opt = await body(request, EditRepoOption)
    edited = forge(request).edit_repo(
        owner, repo, new_name=opt.name, archived=opt.archived, description=opt.description
    )
    return reply(edited)


@router.post("/repos/{owner}/{repo}/transfer")
async def transfer_repo(request: Request, owner: str, repo: str) -> JSONResponse:
    """Gitea's `Transfer`: 202 with the moved repo (the old path then redirects); 403 for
    a caller not its owner, 404 for an unknown new owner, 422 for a taken name."""
    opt = await body(request, TransferRepoOption)
    moved = forge(request).transfer_repo(owner, repo, opt.new_owner, login(request))
    return reply(moved, 202)


@router.get("/repos/{owner}/{repo}/labels")
async def list_labels(request: Request, owner: str, repo: str) -> JSONResponse:
    """Repo labels; all unless `page` is given."""
    labels, total = forge(request).list_labels(
        owner, repo, int_param(request, "page"), int_param(request, "limit")
    )
    return reply(labels, headers=total_headers(total))


@router.post("/repos/{owner}/{repo}/labels")
async def create_label(request: Request, owner: str, repo: str) -> JSONResponse:
    """Create a label (duplicates allowed)."""
    opt = await body(request, CreateLabelOption)
    label = forge(request).create_label(owner, repo, opt.name, opt.color, opt.description or "")
    return reply(label, 201)


@router.patch("/repos/{owner}/{repo}/labels/{label_id}")
async def edit_label(request: Request, owner: str, repo: str, label_id: str) -> JSONResponse:
    """Gitea's `EditLabel`: name, color, description; 200, 404 unknown, 422 bad color."""
    opt = await body(request, EditLabelOption)
    label = forge(request).edit_label(
        owner,
        repo,
        index(label_id),
        new_name=opt.name,
        color=opt.color,
        description=opt.description,
    )
    return reply(label)


@router.delete("/repos/{owner}/{repo}/labels/{label_id}")
async def delete_label(request: Request, owner: str, repo: str, label_id: str) -> Response:
    """Delete a label (it leaves every issue); 204, or 404 when unknown."""
    forge(request).delete_label(owner, repo, index(label_id))
    return Response(status_code=204)
