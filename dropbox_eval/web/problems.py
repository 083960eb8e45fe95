"""The error answer of every API route: a problem document with a stable reason code, from
the one table (errors.answer_for), with `Retry-After` where waiting helps."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ..errors import (
    DropboxEvalError,
    Overloaded,
    StorageUnavailable,
    answer_for,
    error_document,
    storage_cause,
    storage_error,
)

log = logging.getLogger("dropbox_eval")
STORAGE_RETRY_AFTER = "60"  # seconds: a disk is freed by a person, not in a moment


class Problem(BaseModel):
    """Every error answer: a stable reason code and words a client can act on."""

    ok: bool = False
    reason: str
    message: str


def problem_response(error: DropboxEvalError) -> JSONResponse:
    """The answer to an error, from the one table (errors.answer_for). A full or read-only
    folder says when to try again (it clears by itself once space returns), and names the
    cause but not the service's paths (they are the operator's: `/readyz`, the log)."""
    status, _, reason = answer_for(error)
    if isinstance(error, StorageUnavailable):
        message = f"the service cannot store anything now: {storage_cause(error.errno or 0)}"
        body = {"ok": False, "reason": reason, "message": f"{message}; try again later"}
        return JSONResponse(body, status, headers={"Retry-After": STORAGE_RETRY_AFTER})
    if isinstance(error, Overloaded):  # nothing was read: the same request may come again
        headers = {"Retry-After": str(error.retry_after)}
        return JSONResponse(error_document(error), status, headers=headers)
    return JSONResponse(error_document(error), status_code=status)


def os_error_response(error: OSError) -> JSONResponse:
    """The last net under a request: a full, read-only or refused folder met where no
    writer translated it answers as StorageUnavailable does; any other OSError is a 500
    problem document (the log has the details), never a bare `Internal Server Error`."""
    storage = storage_error(error)
    if storage is not None:
        return problem_response(storage)
    log.error("request failed: %s", error, exc_info=error)
    return problem_response(DropboxEvalError("internal error: the service log says more"))
