"""The HTTP API (`dropbox-eval serve`): the inbox's operations for programs.

Each client authenticates with its own API key (`Authorization: Bearer <key>`, issued by
`dropbox-eval clients api-key ID`) and sees only its own batches: another client's batch
answers 404, exactly like a batch that does not exist.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..delivery.deliverer import stored_report
from ..delivery.emitter import FixedReport
from ..errors import (
    DropboxEvalError,
    NotFinished,
    NotFoundError,
)
from ..intake.accept import API_SOURCE
from ..models import BatchFile, BatchRecord, BatchStatus, Client
from ..ops.retention import Retention
from ..protocol.batchfile import check_size, parse_batch, reason_of
from ..protocol.batchlines import is_lines_media_type, parse_batch_lines, report_lines
from ..protocol.documents import Acceptance, RetryAcceptance
from ..protocol.report import in_client_order
from ..store import Store
from ..views import Views, for_client
from .apidocs import add_offline_docs
from .callers import check_cursor, client_audit, listing_caller, listing_scope
from .fairdoor import FairDoor
from .parts import ApiParts
from .problems import Problem, os_error_response, problem_response


def _inlined(schema: Any, defs: dict[str, Any]) -> Any:
    """A JSON schema with its local `$defs` references written out (for OpenAPI)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inlined(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inlined(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(item, defs) for item in schema]
    return schema


_SCHEMA = BatchFile.model_json_schema()
BATCH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _inlined(_SCHEMA, _SCHEMA.get("$defs", {}))}},
    }
}

bearer = HTTPBearer(auto_error=False)
log = logging.getLogger("dropbox_eval")


def _authenticate(
    client_for_key: Callable[[str], Client | None],
) -> Callable[[HTTPAuthorizationCredentials | None], Client]:
    """The dependency naming the client whose API key authenticates a request (401
    otherwise)."""

    def client_of(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Client:
        client = client_for_key(credentials.credentials) if credentials else None
        if client is None:
            raise HTTPException(401, "a valid API key is required (Authorization: Bearer ...)")
        return client

    return client_of


def create_api(parts: ApiParts) -> FastAPI:
    """The client API over the parts it uses."""
    api = FastAPI(
        title="dropbox-eval",
        version=__version__,
        description="Eval batches: submit, follow, emit, cancel, retry.",
        docs_url=None,  # apidocs.py serves them without a CDN
        redoc_url=None,
    )
    add_offline_docs(api)
    views = Views(parts.store)
    retention = Retention(
        parts.store, parts.billing, parts.settings, audit=client_audit(parts.store)
    )
    # used as a default, not in Annotated: postponed annotations are resolved in the
    # module, where this app's own dependency has no name
    caller = Depends(_authenticate(parts.billing.client_for_key))
    listing = Depends(listing_caller(_authenticate(parts.billing.client_for_key), parts.settings))
    problems: dict[int | str, dict[str, Any]] = {
        code: {"model": Problem} for code in (401, 402, 403, 404, 409, 413, 422, 429, 502, 503, 507)
    }
    door = api.state.door = FairDoor(parts.settings)  # new batches, client by client in turn

    def owned(batch_id: str, client: Client, *, tasks: bool = False) -> dict[str, Any]:
        """The caller's batch; another client's answers 404 like one that does not exist."""
        read = views.batch if tasks else views.batch_summary
        try:
            return for_client(read(batch_id, client_id=client.client_id))
        except NotFoundError:
            raise HTTPException(404, f"no batch {batch_id!r}") from None

    @api.exception_handler(DropboxEvalError)
    def problem(_request: Request, exc: DropboxEvalError) -> JSONResponse:
        return problem_response(exc)

    @api.exception_handler(OSError)
    def os_error(_request: Request, exc: OSError) -> JSONResponse:
        return os_error_response(exc)

    @api.exception_handler(StarletteHTTPException)  # unknown paths and methods too
    def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = {
            401: "unauthorized",
            403: "forbidden",
            404: "not_found",
            405: "method_not_allowed",
            422: "invalid_request",
            429: "too_many_attempts",
        }.get(exc.status_code, "error")
        body = {"ok": False, "reason": reason, "message": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(RequestValidationError)
    def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": ".".join(str(p) for p in e["loc"][1:]), "reason": reason_of(e)}
            for e in exc.errors()[:20]
        ]
        message = f"{errors[0]['field']}: {errors[0]['reason']}" if errors else "invalid request"
        body = {"ok": False, "reason": "invalid_request", "message": message, "errors": errors}
        return JSONResponse(body, status_code=422)

    accepted: dict[int | str, dict[str, Any]] = {
        201: {"model": Acceptance, "description": "the batch is recorded"},
        200: {"model": Acceptance, "description": "a duplicate: the earlier batch"},
    }

    @api.post(
        "/api/eval/batches",
        status_code=201,
        response_model=None,
        responses=problems | accepted,
        openapi_extra=BATCH_BODY,
    )
    async def submit(
        request: Request, response: Response, client: Client = caller
    ) -> dict[str, Any]:
        """Submit a batch: the inbox's parser, limits, answers and funded check; taken in
        client by client in turn (429 or 503 with `Retry-After` while too many wait)."""
        async with door.place(client.client_id) as place:
            raw = await _body(request, parts.settings.max_file_bytes)
            limits = parts.settings
            lines = is_lines_media_type(request.headers.get("content-type", ""))
            parse = parse_batch_lines if lines else parse_batch
            batch = parse(raw, max_bytes=limits.max_file_bytes, max_tasks=limits.max_tasks)
            # the same body again is the same batch (a client retrying a timed-out POST)
            sha256 = hashlib.sha256(raw).hexdigest()
            await place.turn()
            result = await run_in_threadpool(
                parts.intake.accept, batch, client.client_id, source=API_SOURCE, sha256=sha256
            )
        if result.get("duplicate"):
            response.status_code = 200
        return result

    @api.post("/hooks/forge", status_code=202, include_in_schema=False)
    async def forge_webhook(request: Request) -> JSONResponse:
        """A Gitea/Forgejo webhook delivery (signed with SAAS_EVAL_FORGE_WEBHOOK_SECRET)."""
        raw = await _body(request, parts.settings.max_file_bytes)
        headers = {k.lower(): v for k, v in request.headers.items()}
        status, outcome = parts.webhooks.receive(headers, raw)
        return JSONResponse({"ok": status < 400, "outcome": outcome}, status_code=status)

    @api.get("/api/eval/batches", responses=problems)
    def list_batches(
        request: Request,
        response: Response,
        lister: Client | None = listing,
        status: Annotated[BatchStatus | None, Query()] = None,
        client: Annotated[str | None, Query(description="the operator's key only")] = None,
        after: Annotated[str | None, Query(description="cursor: X-Next-After")] = None,
        page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
        limit: Annotated[int, Query(ge=1, le=100)] = 50,
    ) -> list[dict[str, Any]]:
        """The caller's batches (the operator's key: everyone's, or `client`'s), newest
        first, only those with `status` if given; paged by `page` or by the cursor `after`
        (`X-Next-After` names the next page's, `X-Total-Count` the total); the cost follows
        the page, not the history."""
        scope = listing_scope(lister, client)
        if after is not None and page != 1:
            raise HTTPException(422, "page a list by `page` or by `after`, not both")
        check_cursor(views, after, scope)
        counts = views.count(scope)
        total = counts.get(status, 0) if status else sum(counts.values())
        response.headers["X-Total-Count"] = str(total)
        offset = (page - 1) * limit
        rows = views.batches(
            client_id=scope, status=status, limit=limit + 1, offset=offset, after=after
        )
        if len(rows) > limit:  # one more than the page: a next page exists
            rows = rows[:limit]
            next_after = str(rows[-1]["batch_id"])
            response.headers["X-Next-After"] = next_after
            link = request.url.remove_query_params("page").include_query_params(after=next_after)
            response.headers["Link"] = f'<{link}>; rel="next"'
        return rows if lister is None else [for_client(row) for row in rows]

    @api.get("/api/eval/batches/{batch_id}", responses=problems)
    def get_batch(batch_id: str, client: Client = caller) -> dict[str, Any]:
        """One batch: progress (with tasks still settling), counts per status, attempts and
        delivery, and each task's issue, status and result; a deleted one's tombstone."""
        try:
            return owned(batch_id, client, tasks=True)
        except HTTPException:
            buried = views.tombstone(batch_id, client_id=client.client_id)
            if buried is None:
                raise
            return buried

    @api.delete("/api/eval/batches/{batch_id}", responses=problems)
    def delete_batch(batch_id: str, client: Client = caller) -> dict[str, Any]:
        """Delete an ended batch of the caller: its report, task details and files go, its
        tombstone (id, client, status, dates, counts, charge) stays and is the answer; 409
        `not_finished` while it runs. Its report answers 404 from then on."""
        return retention.delete(batch_id, client_id=client.client_id)

    @api.get(
        "/api/eval/batches/{batch_id}/report",
        responses=problems
        | {200: {"content": {"application/json": {}, "application/x-ndjson": {}}}},
        response_class=Response,
    )
    def get_report(batch_id: str, request: Request, client: Client = caller) -> Response:
        """The report of an ended batch: the same bytes as `outbox/<batch_id>.json` and
        the callback body (409 `not_finished` while it runs); as JSON Lines (the batch,
        then one line per task, streamed) when `Accept` names `application/x-ndjson` or
        `application/jsonl`."""
        owned(batch_id, client)  # another client's answers 404
        report = _report_of(parts.store, parts.store.get_batch(batch_id))
        accept = request.headers.get("accept", "").split(",")
        if any(is_lines_media_type(kind) for kind in accept):
            if isinstance(report, FixedReport):
                with report.handle:
                    report = report.whole()
            lines = report_lines(in_client_order(report))
            return StreamingResponse(lines, media_type="application/x-ndjson")
        if isinstance(report, FixedReport):  # a big one is never held whole
            length = {"Content-Length": str(report.size())}
            return StreamingResponse(report.drain(), media_type="application/json", headers=length)
        return Response(report, media_type="application/json")

    @api.post("/api/eval/batches/{batch_id}/emit", responses=problems)
    def emit(
        batch_id: str, client: Client = caller, force: Annotated[bool, Query()] = False
    ) -> dict[str, Any]:
        """Deliver the report of a finished batch (again with `force`)."""
        owned(batch_id, client)
        return parts.delivery.emit(batch_id, force=force)

    @api.post("/api/eval/batches/{batch_id}/cancel", responses=problems)
    def cancel(batch_id: str, client: Client = caller) -> dict[str, Any]:
        """Cancel a running batch; finished results are kept, the report is emitted."""
        owned(batch_id, client)
        done = parts.lifecycle.cancel(batch_id)
        return {
            "ok": True,
            "batch_id": done.batch_id,
            "status": done.status,
            "charged": done.charged,
        }

    @api.post(
        "/api/eval/batches/{batch_id}/retry",
        status_code=201,
        response_model=None,
        responses={
            **problems,
            201: {"model": RetryAcceptance, "description": "the retry is a new batch"},
        },
    )
    def retry(batch_id: str, client: Client = caller) -> dict[str, Any]:
        """Retry a failed or expired batch of the caller: a new batch with its failed and
        aborted tasks, linked both ways (`retry_of`, `retried_by`), holding credits."""
        owned(batch_id, client)
        return parts.retries.retry(batch_id, client_id=client.client_id)

    return api


def _report_of(store: Store, batch: BatchRecord) -> bytes | FixedReport:
    """A batch's report as the outbox file holds it (the report fixed when it ended, where
    the store keeps it: the caller closes it)."""
    if batch.status == BatchStatus.RUNNING:
        raise NotFinished(
            f"batch {batch.batch_id}: {batch.done}/{batch.total} tasks finished; the report "
            "comes when it ends",
            done=batch.done,
            total=batch.total,
        )
    return stored_report(store, batch)


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes the limit: never parsed whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit():
        check_size(int(declared), limit)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        check_size(total, limit)
        chunks.append(chunk)
    return b"".join(chunks)
