"""Routes: issues, comments and issue labels."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .errors import SandboxApiError
from .query import IssueQuery, page_size, parse_time
from .schemas import CreateCommentOption, CreateIssueOption, EditIssueOption, IssueLabelsOption
from .web import body, forge, index, int_param, login, paged_reply, reply, total_headers

router = APIRouter(prefix="/api/v1/repos/{owner}/{repo}/issues")


def issue_query(request: Request, default_limit: int | None = None) -> IssueQuery:
    """The filters and paging of an issue list or search request, read like Gitea
    (`default_limit`: the search's own default page size)."""
    params = request.query_params
    state = params.get("state", "open")
    labels = params.get("labels", "")
    return IssueQuery(
        state=state if state in ("closed", "all") else "open",
        labels=tuple(labels.split(",")) if labels else (),
        since=parse_time(params.get("since")),
        before=parse_time(params.get("before")),
        page=max(1, int_param(request, "page") or 1),
        limit=page_size(int_param(request, "limit"), default_limit),
        pulls_only=params.get("type") == "pulls",
        issues_only=params.get("type") == "issues",
    )


@router.get("")
async def list_issues(request: Request, owner: str, repo: str) -> JSONResponse:
    """Issues newest first, filtered and paged like Gitea."""
    query = issue_query(request)
    items, total = forge(request).list_issues(owner, repo, query)
    return paged_reply(request, items, total, query.page, query.limit)


@router.post("")
async def create_issue(request: Request, owner: str, repo: str) -> JSONResponse:
    """Create an issue (label ids only)."""
    opt = await body(request, CreateIssueOption)
    people = list(opt.assignees or []) + ([opt.assignee] if opt.assignee else [])
    issue = forge(request).create_issue(
        owner,
        repo,
        login(request),
        opt.title,
        body=opt.body or "",
        labels=opt.labels or [],
        assignees=people,
        closed=bool(opt.closed),
    )
    return reply(issue, 201)


@router.get("/comments")
async def repo_comments(request: Request, owner: str, repo: str) -> JSONResponse:
    """Repo-wide comments; unpaginated unless `page` is given."""
    params = request.query_params
    items, total = forge(request).repo_comments(
        owner,
        repo,
        since=parse_time(params.get("since")),
        before=parse_time(params.get("before")),
        page=int_param(request, "page"),
        limit=int_param(request, "limit"),
    )
    return reply(items, headers=total_headers(total))


@router.patch("/comments/{comment_id}")
async def edit_comment(request: Request, owner: str, repo: str, comment_id: str) -> JSONResponse:
    """Gitea's `EditIssueComment` (200); the issue itself is not touched."""
    opt = await body(request, CreateCommentOption)
    comment = forge(request).edit_comment(owner, repo, index(comment_id), login(request), opt.body)
    return reply(comment)


@router.patch("/{number}/comments/{comment_id}")
async def edit_comment_deprecated(
    request: Request, owner: str, repo: str, number: str, comment_id: str
) -> JSONResponse:
    """`EditIssueCommentDeprecated`: the issue index is ignored."""
    return await edit_comment(request, owner, repo, comment_id)


@router.delete("/comments/{comment_id}")
async def delete_comment(request: Request, owner: str, repo: str, comment_id: str) -> Response:
    """Gitea's `DeleteIssueComment`: 204; 404 unknown; 403 (no body) for a caller who
    neither posted it nor may write the repo. The comment leaves the timeline."""
    forge(request).delete_comment(owner, repo, index(comment_id), login(request))
    return Response(status_code=204)


@router.delete("/{number}/comments/{comment_id}")
async def delete_comment_deprecated(
    request: Request, owner: str, repo: str, number: str, comment_id: str
) -> Response:
    """`DeleteIssueCommentDeprecated`: the issue index is ignored."""
    return await delete_comment(request, owner, repo, comment_id)


@router.get("/{number}")
async def get_issue(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """One issue."""
    return reply(forge(request).get_issue(owner, repo, index(number)))


@router.patch("/{number}")
async def edit_issue(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """Edit an issue; answers 201 like Gitea."""
    opt = await body(request, EditIssueOption)
    issue = forge(request).edit_issue(
        owner,
        repo,
        index(number),
        title=opt.title,
        body=opt.body,
        state=opt.state,
        doer=login(request),
    )
    return reply(issue, 201)


@router.delete("/{number}")
async def delete_issue(request: Request, owner: str, repo: str, number: str) -> Response:
    """Delete an issue."""
    forge(request).delete_issue(owner, repo, index(number))
    return Response(status_code=204)


@router.get("/{number}/comments")
async def issue_comments(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """All comments of an issue (missing issue: 500 on Gitea, 404 on Forgejo)."""
    params = request.query_params
    items = forge(request).issue_comments(
        owner,
        repo,
        index(number, quirk_500=_quirk(request)),
        parse_time(params.get("since")),
        parse_time(params.get("before")),
    )
    return reply(items, headers=total_headers(len(items)))


@router.post("/{number}/comments")
async def create_comment(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """Comment on an issue (missing issue: 500 on Gitea, 404 on Forgejo)."""
    opt = await body(request, CreateCommentOption)
    comment = forge(request).create_comment(
        owner, repo, index(number, quirk_500=_quirk(request)), login(request), opt.body
    )
    return reply(comment, 201)


@router.get("/{number}/labels")
async def issue_labels(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """Labels on an issue."""
    return reply(forge(request).issue_labels(owner, repo, index(number)))


@router.post("/{number}/labels")
async def add_issue_labels(request: Request, owner: str, repo: str, number: str) -> JSONResponse:
    """Add labels by ids or names; answers all labels now on the issue."""
    opt = await body(request, IssueLabelsOption)
    ids, names = split_labels(opt.labels or [])
    labels = forge(request).add_issue_labels(
        owner, repo, index(number), ids, names, doer=login(request)
    )
    return reply(labels)


@router.delete("/{number}/labels/{label_id}")
async def remove_issue_label(
    request: Request, owner: str, repo: str, number: str, label_id: str
) -> Response:
    """Take one label off an issue: 204; 422 for an unknown label id."""
    forge(request).remove_issue_label(
        owner, repo, index(number), index(label_id), doer=login(request)
    )
    return Response(status_code=204)


def _quirk(request: Request) -> bool:
    """Whether a garbage issue index answers 500 (Gitea) instead of 404 (Forgejo)."""
    return forge(request).flavor.missing_issue_status == 500


def split_labels(values: list[object]) -> tuple[list[int], list[str]]:
    """Split an all-ints or all-strings list like Gitea; mixing or other types -> 400."""
    ids: list[int] = []
    names: list[str] = []
    for value in values:
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            ids.append(int(value))
        else:
            raise SandboxApiError(400, "a label must be an integer or a string")
    if ids and names:
        raise SandboxApiError(400, "labels should be an array of strings or integers")
    return ids, names
