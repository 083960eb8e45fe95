"""The operator's batch pages: one batch (`/operator/batches/{id}`) and the list of ended
batches (`/operator/batches`), with Cancel.

Both behind the same door as the overview (door.py): no session answers the login page
(401), and says nothing of whether a batch exists. A batch page shows what `dropbox-eval
batch ID` and the API show (the one read model, views/), with links to the repo, issues and
pull requests built from SAAS_EVAL_GITEA_URL; an unknown id, or a batch outside the
`client` the page was opened for (a link from a list filtered by client), answers 404.
Cancel takes two posts, each with the session's CSRF token: the first answers a page that
asks to confirm, the second cancels through `Lifecycle.cancel`, as the CLI and the API do.
The list of ended batches is paged from the archive (`Store.page_batches`), newest first,
filtered by client and status; its cost follows the page, not the history
(bench/metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ..errors import DropboxEvalError, NotFoundError, answer_for
from ..models import BatchRecord, BatchStatus, is_valid_id
from ..util.redact import shown_url
from ..views import Views
from .door import Door, form_of

PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
ENDED = tuple(str(s) for s in BatchStatus if s is not BatchStatus.RUNNING)
REFRESH_SECONDS = 5  # a running batch's page follows it


def batch_path(batch_id: str) -> str:
    """The page of a batch (the overview for an id no batch can have)."""
    return f"/operator/batches/{quote(batch_id, safe='')}" if is_valid_id(batch_id) else "/operator"


def add_batch_pages(
    api: FastAPI,
    door: Door,
    views: Views,
    gitea_url: str | None,
    cancel_batch: Callable[[str], BatchRecord],
) -> None:
    """Mount the batch page, its Cancel (`cancel_batch`, the lifecycle's) and the list of
    ended batches on `api`; `gitea_url` makes the links to the forge."""

    def missing(request: Request, message: str) -> Response:
        return door.render(request, "missing.html", 404, message=message)

    @api.get("/operator/batches/{batch_id}", include_in_schema=False)
    def batch_page(request: Request, batch_id: str, client: str | None = None) -> Response:
        if door.session_of(request) is None:
            return door.login_page("sign in first", 401)
        try:
            batch = views.batch_page(batch_id, gitea_url, client_id=client or None)
        except NotFoundError:
            return missing(request, f"no batch {batch_id!r}")
        callback = batch.get("callback_url")
        return door.render(
            request,
            "batch.html",
            b=batch,
            destination=shown_url(callback) if callback else "the outbox",
            refresh=REFRESH_SECONDS if batch["status"] == BatchStatus.RUNNING else None,
            path=batch_path(batch_id),
        )

    @api.post("/operator/batches/{batch_id}/cancel", include_in_schema=False)
    async def cancel(request: Request, batch_id: str) -> Response:
        refused = await door.refusal(request)
        if refused is not None:
            return refused
        if (await form_of(request)).get("confirm") != "yes":
            try:
                batch = views.batch_summary(batch_id)
            except NotFoundError:
                return missing(request, f"no batch {batch_id!r}")
            return door.render(request, "confirm.html", b=batch, path=batch_path(batch_id))
        try:
            done = await run_in_threadpool(cancel_batch, batch_id)
            note = (
                f"{batch_id}: {done.status}, charged {done.charged}"
                if done.status != BatchStatus.RUNNING
                else f"{batch_id}: cancel stored; the service closes its open issues"
            )
            result = "ok"
        except DropboxEvalError as exc:
            note, result = f"{batch_id}: not cancelled: {exc}", answer_for(exc)[2]
        await run_in_threadpool(door.record, request, "cancel", batch_id, result)
        return door.done(request, note, batch_path(batch_id))

    @api.get("/operator/batches", include_in_schema=False)
    def ended(
        request: Request,
        client: str = "",
        status: str = "",
        page: int = 1,
        limit: int = PAGE_SIZE,
    ) -> Response:
        if door.session_of(request) is None:
            return door.login_page("sign in first", 401)
        problem = _bad_filter(client, status, page, limit)
        if problem:
            return door.render(request, "missing.html", 400, message=problem)
        rows, total = views.finished(
            client_id=client or None,
            status=status or None,
            limit=limit,
            offset=(page - 1) * limit,
        )
        chosen = {"client": client, "status": status, "limit": limit if limit != PAGE_SIZE else ""}
        scope = f"?{urlencode({'client': client})}" if client else ""
        return door.render(
            request,
            "batches.html",
            rows=rows,
            total=total,
            page=page,
            pages=max(1, -(-total // limit)),
            clients=[c["client_id"] for c in views.clients()],
            statuses=ENDED,
            chosen=chosen,
            scope=scope,
            link=lambda n: _page_link(chosen, n),
        )


def _bad_filter(client: str, status: str, page: int, limit: int) -> str | None:
    """What is wrong with the list's filter, if anything."""
    if client and not is_valid_id(client):
        return f"no client {client!r}"
    if status and status not in ENDED:
        return f"unknown status {status!r}: one of {', '.join(ENDED)}"
    if page < 1 or not 1 <= limit <= MAX_PAGE_SIZE:
        return f"page must be 1 or more and limit 1 to {MAX_PAGE_SIZE}"
    return None


def _page_link(chosen: Mapping[str, object], page: int) -> str:
    """The list's address for page `page` with the same filter (empty fields left out)."""
    fields = {name: value for name, value in chosen.items() if value} | {"page": page}
    return f"/operator/batches?{urlencode(fields)}"
