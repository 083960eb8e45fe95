"""The HTTP API (`dropbox-eval serve`): the inbox's operations for programs.

Each client authenticates with its own API key (`Authorization: Bearer <key>`, issued by
`dropbox-eval clients api-key ID`) and sees only its own batches: another client's batch
answers 404, exactly like a batch that does not exist.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from . import __version__
from .errors import (
    BatchRejected,
    ConfigError,
    DeliveryError,
    DropboxEvalError,
    ForgeError,
    NotFoundError,
)
from .intake import rejection_from_validation
from .models import BatchFile, BatchRecord, Client
from .report import status_counts
from .service import App

REJECTION_STATUS = {"unfunded": 402, "unknown_client": 403, "client_mismatch": 403}
bearer = HTTPBearer(auto_error=False)


class Problem(BaseModel):
    """Every error answer: a stable reason code and words a client can act on."""

    ok: bool = False
    reason: str
    message: str


class ApiProblem(Exception):
    """Raised by a handler; answered as `{"ok": false, "reason", "message", ...}`."""

    def __init__(self, status: int, reason: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, {"ok": False, "reason": reason, "message": message,
                                          **extra}

    @classmethod
    def rejected(cls, exc: BatchRejected) -> ApiProblem:
        """The answer to a batch the inbox would have rejected."""
        problem = cls(REJECTION_STATUS.get(exc.reason, 422), exc.reason, exc.message)
        problem.body.update(exc.as_dict())
        return problem


def _client_of(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Client:
    """The client whose API key authenticates this request (401 otherwise)."""
    app: App = request.app.state.components
    client = app.billing.client_for_key(credentials.credentials) if credentials else None
    if client is None:
        raise HTTPException(401, "a valid API key is required (Authorization: Bearer ...)")
    return client


Caller = Annotated[Client, Depends(_client_of)]


def create_api(app: App) -> FastAPI:
    """The FastAPI application over the wired components."""
    api = FastAPI(title="dropbox-eval", version=__version__,
                  description="Eval batches: submit, follow, emit, cancel.")
    api.state.components = app
    problems: dict[int | str, dict[str, Any]] = {
        code: {"model": Problem} for code in (401, 402, 403, 404, 409, 422, 502)}

    def owned(batch_id: str, client: Client) -> BatchRecord:
        try:
            batch = app.store.get_batch(batch_id)
        except NotFoundError:
            batch = None
        if batch is None or batch.client_id != client.client_id:
            raise HTTPException(404, f"no batch {batch_id!r}")
        return batch

    @api.exception_handler(ApiProblem)
    def problem(_request: Request, exc: ApiProblem) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @api.exception_handler(HTTPException)
    def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        reason = {401: "unauthorized", 404: "not_found"}.get(exc.status_code, "error")
        body = {"ok": False, "reason": reason, "message": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code)

    @api.exception_handler(RequestValidationError)
    def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": ".".join(str(p) for p in e["loc"][1:]), "reason": e["msg"]}
                  for e in exc.errors()[:20]]
        message = f"{errors[0]['field']}: {errors[0]['reason']}" if errors else "invalid request"
        body = {"ok": False, "reason": "invalid_batch", "message": message, "errors": errors}
        return JSONResponse(body, status_code=422)

    @api.post("/api/eval/batches", status_code=201, responses=problems)
    def submit(document: dict[str, Any], client: Caller, response: Response) -> dict[str, Any]:
        """Submit a batch (same validation and funded check as the inbox)."""
        # the same body again is the same batch (a client retrying a timed-out POST)
        sha256 = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
        try:
            batch = BatchFile.model_validate(document)
            result = app.intake.accept(batch, client.client_id, source="api", sha256=sha256)
        except ConfigError as exc:
            raise ApiProblem(503, "not_configured", str(exc)) from exc
        except ValidationError as exc:
            raise ApiProblem.rejected(rejection_from_validation(exc)) from exc
        except BatchRejected as exc:
            raise ApiProblem.rejected(exc) from exc
        if result.get("duplicate"):
            response.status_code = 200
        return result

    @api.get("/api/eval/batches", responses=problems)
    def list_batches(client: Caller, response: Response,
                     page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
                     limit: Annotated[int, Query(ge=1, le=100)] = 50) -> list[dict[str, Any]]:
        """The caller's batches, oldest first, paged (`X-Total-Count` has the total)."""
        rows = app.store.list_batches(lambda r: r["client_id"] == client.client_id)
        response.headers["X-Total-Count"] = str(len(rows))
        return rows[(page - 1) * limit: page * limit]

    @api.get("/api/eval/batches/{batch_id}", responses=problems)
    def get_batch(batch_id: str, client: Caller) -> dict[str, Any]:
        """One batch with counts per status and each task's issue, status and summary."""
        batch = owned(batch_id, client)
        tasks = app.store.get_tasks(batch.batch_id)
        data = batch.model_dump(mode="json", exclude={"report", "sha256", "source"})
        data["counts"] = status_counts(tasks, every_status=True)
        data["tasks"] = [
            {"task_id": t.task_id, "status": t.status, "issue_number": t.issue_number,
             "issue_url": t.issue_url, "summary": t.result.summary if t.result else None,
             "details": t.result.details if t.result else None}
            for t in tasks
        ]
        return data

    @api.post("/api/eval/batches/{batch_id}/emit", responses=problems)
    def emit(batch_id: str, client: Caller,
             force: Annotated[bool, Query()] = False) -> dict[str, Any]:
        """Deliver the report of a finished batch (again with `force`)."""
        batch = owned(batch_id, client)
        try:
            result = app.intake.emit(batch.batch_id, force=force)
        except DeliveryError as exc:
            raise ApiProblem(502, "delivery_failed", str(exc)) from exc
        if not result["ok"]:
            raise ApiProblem(409, "not_finished", f"{result['done']}/{result['total']} tasks "
                             "finished", done=result["done"], total=result["total"])
        return result

    @api.post("/api/eval/batches/{batch_id}/cancel", responses=problems)
    def cancel(batch_id: str, client: Caller) -> dict[str, Any]:
        """Cancel a running batch; finished results are kept, the report is emitted."""
        batch = owned(batch_id, client)
        if batch.status != "running":
            raise ApiProblem(409, "not_running", f"batch is {batch.status}")
        try:
            done = app.intake.cancel(batch.batch_id)
        except ForgeError as exc:
            raise ApiProblem(502, "forge_error", f"cancel stored, finishing later: {exc}") from exc
        except DropboxEvalError as exc:
            raise ApiProblem(409, "not_running", str(exc)) from exc
        return {"ok": True, "batch_id": done.batch_id, "status": done.status,
                "charged": done.charged}

    return api
