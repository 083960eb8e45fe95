"""The project's errors: one base class, every third-party error translated at one boundary.

Tree::

    DropboxEvalError
    +-- ConfigError            a setting is missing or invalid (names the variable)
    |   +-- NoState            a read-only command found no state folder at that place
    +-- InvalidArgument        an operator's argument is unusable (bad client id, 0 credits)
    +-- StoreError             state files unreadable or corrupt (never silently reset)
    |   +-- StorageUnavailable a folder is read-only or refused (also an OSError)
    |       +-- StorageFull    a folder's disk is full or over quota
    +-- NotFoundError          unknown batch or client id asked for by an operator
    +-- BatchRejected          a dropped batch cannot be accepted (reason code + details)
    |   +-- ClientDisabled     the client is disabled: every door refuses new work (403)
    +-- ForgeError             anything the forge did wrong (forge.py is the boundary)
    |   +-- ForgeRetryable     timeouts, resets, 429, 5xx: try again later
    |   +-- ForgePermanent     4xx that retrying cannot fix
    |       +-- ForgeAuthError 401/403: token or permission problem
    |       +-- ForgeNotFound  404: repo or issue does not exist (deleted)
    +-- DeliveryError          a report could not be delivered (emitter.py is the boundary)
    +-- Overloaded             a door holds as much waiting work as it may: try again later
    |   +-- TooManyWaiting     the client's own share of it is full (429)
    |   +-- DoorFull           every client's share together is full (503)
    +-- AlreadyRunning         another service instance holds the state folder
    +-- Conflict               the operation does not fit the batch's state
        +-- NotFinished        emit of a batch that is still running
        +-- NotRunning         cancel of a batch that already ended
        +-- Busy               another process is creating the batch's issues
        +-- NotRetryable       retry of a batch that did not end failed or expired
        +-- AlreadyRetried     retry of a batch that has its retry already
        +-- NotSettled         remove of a client with live batches or credits

`answer_for` is the one table from an error to its HTTP status and CLI exit code;
`error_document` is what the API answers and the CLI prints under `--json`;
`storage_error` translates an OSError by errno (a full, read-only or refused folder).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DropboxEvalError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(DropboxEvalError):
    """A setting is missing or invalid; the message names the environment variable."""


class NoState(ConfigError):
    """A read-only command was pointed at a place that holds no state folder."""


class InvalidArgument(DropboxEvalError):
    """An argument given by an operator or client cannot be used as it is."""


class StoreError(DropboxEvalError):
    """The state folder cannot be read or written."""


class StorageUnavailable(StoreError, OSError):
    """A folder cannot take a write: read-only (EROFS) or refused (EACCES, EPERM).

    Made from an OSError by `storage_error` where files are written; still an OSError with
    the same errno and file name, so code that handles OSError goes on handling it. The
    message names the file or folder and the cause: `state folder /srv/state: read-only
    file system (EROFS)`. Clears by itself once the folder takes writes again."""

    def __init__(self, code: int, path: str | Path, *, what: str = "cannot write") -> None:
        OSError.__init__(self, code, os.strerror(code), str(path))
        self.path = str(path)
        self.message = f"{what} {path}: {storage_cause(code)}"

    def __str__(self) -> str:
        return self.message


class StorageFull(StorageUnavailable):
    """A folder's file system is full (ENOSPC) or its quota is used up (EDQUOT)."""


FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
REFUSED_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def storage_cause(code: int) -> str:
    """`no space left on device (ENOSPC)`: the cause in words, then its errno name."""
    text = os.strerror(code)
    return f"{text[:1].lower()}{text[1:]} ({errno.errorcode.get(code, code)})"


def storage_error(
    exc: OSError, path: str | Path | None = None, *, what: str | None = None
) -> StorageUnavailable | None:
    """The StorageUnavailable (or StorageFull) an OSError stands for, by its errno; None
    for any other OSError (a missing file, a bad descriptor: not a storage state).
    `path` names the file when the OSError does not (or names a temp file)."""
    if isinstance(exc, StorageUnavailable):
        return exc
    kind: type[StorageUnavailable]
    if exc.errno in FULL_ERRNOS:
        kind = StorageFull
    elif exc.errno in REFUSED_ERRNOS:
        kind = StorageUnavailable
    else:
        return None
    if what is None:  # only a write meets a full or read-only disk; a refusal, any use
        what = "cannot use" if exc.errno in (errno.EACCES, errno.EPERM) else "cannot write"
    return kind(exc.errno or 0, path or exc.filename or "a state file", what=what)


@contextlib.contextmanager
def storage_errors(path: str | Path | None = None, *, what: str | None = None) -> Iterator[None]:
    """Raise an OSError of a full, read-only or refused folder met in the block as
    StorageUnavailable (`storage_error`); any other error goes through as it is."""
    try:
        yield
    except StorageUnavailable:
        raise
    except OSError as exc:
        error = storage_error(exc, path, what=what)
        if error is None:
            raise
        raise error from exc


class NotFoundError(DropboxEvalError):
    """An operator asked for a batch or client that does not exist."""


class AlreadyRunning(DropboxEvalError):
    """Another `dropbox-eval run` holds this state folder."""


class BatchRejected(DropboxEvalError):
    """A batch cannot be accepted; `reason` is a stable code a client can act on."""

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        """The error document written beside a rejected file (and answered by the API)."""
        return {"ok": False, "reason": self.reason, "message": self.message, **self.details}


class ClientDisabled(BatchRejected):
    """The operator disabled the client (`clients disable`): a drop, an API request and an
    SFTP login are refused with `client_disabled`; its running batches go on."""

    def __init__(self, client_id: str) -> None:
        super().__init__(
            "client_disabled",
            f"client {client_id!r} is disabled: no new work is taken; ask the operator",
            client_id=client_id,
        )


class ForgeError(DropboxEvalError):
    """The forge answered with an error or could not be reached."""

    def __init__(self, message: str, status: int | None = None, method: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.method = method  # the HTTP method of the request that failed, if any


class ForgeRetryable(ForgeError):
    """A transient forge failure; `retry_after` is the server's hint in seconds, if any."""

    def __init__(
        self, message: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


class ForgePermanent(ForgeError):
    """A forge failure that the same request will hit again."""


class ForgeAuthError(ForgePermanent):
    """The token is missing, wrong, or lacks a permission."""


class ForgeNotFound(ForgePermanent):
    """The repository or issue does not exist (or is not visible to the token)."""


class DeliveryError(DropboxEvalError):
    """A report could not be delivered to its callback URL."""


class Overloaded(DropboxEvalError):
    """A door (web/fairdoor.py) holds as much waiting work as it may; nothing was read or
    kept: the same request may come again after `retry_after` seconds."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooManyWaiting(Overloaded):
    """The client has as much waiting at the door as one client may."""


class DoorFull(Overloaded):
    """The door holds as much waiting work as it may, all clients together."""


class Conflict(DropboxEvalError):
    """The operation does not fit the batch's current state; `reason` is a stable code."""

    reason = "conflict"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


class NotFinished(Conflict):
    """The batch still has unfinished tasks."""

    reason = "not_finished"


class NotRunning(Conflict):
    """The batch has already ended."""

    reason = "not_running"


class Busy(Conflict):
    """Another process holds the batch's lease; try again in a minute."""

    reason = "busy"


class NotRetryable(Conflict):
    """Only a `failed` or `expired` batch with failed or aborted tasks can be retried."""

    reason = "not_retryable"


class AlreadyRetried(Conflict):
    """The batch was retried already (`retried_by` names its retry)."""

    reason = "already_retried"


class NotSettled(Conflict):
    """A client is removed only when nothing of it is live and its balance is zero."""

    reason = "not_settled"


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REJECTED, EXIT_RUNNING = 0, 1, 2, 3, 4, 5
EXIT_NOT_RUNNING = 3  # `status` of a stopped service, as `systemctl status` says "inactive"
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it
# every exit code the CLI documents (README "Exit codes"); a test reaches each one
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "an operation failed (forge, delivery, state; a batch in the wrong state)",
    EXIT_USAGE: "usage or configuration error (bad flag or argument, missing setting, no state)",
    EXIT_NOT_FOUND: "unknown batch or client; `status`: the service is not running",
    EXIT_REJECTED: "the submitted batch was rejected",
    EXIT_RUNNING: "another service already runs on this state folder",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
REJECTION_HTTP_STATUS = {
    "unfunded": 402,
    "unknown_client": 403,
    "client_disabled": 403,
    "client_mismatch": 403,
    "too_large": 413,
    "use_retry": 409,
}

# (error class, HTTP status, exit code, reason code); the first matching row answers
_ANSWERS: tuple[tuple[type[DropboxEvalError], int, int, str], ...] = (
    (ConfigError, 503, EXIT_USAGE, "not_configured"),
    (InvalidArgument, 422, EXIT_USAGE, "invalid_argument"),
    (NotFoundError, 404, EXIT_NOT_FOUND, "not_found"),
    (BatchRejected, 422, EXIT_REJECTED, "invalid_batch"),
    (Conflict, 409, EXIT_FAILED, "conflict"),
    (AlreadyRunning, 409, EXIT_RUNNING, "already_running"),
    (ForgeError, 502, EXIT_FAILED, "forge_error"),
    (DeliveryError, 502, EXIT_FAILED, "delivery_failed"),
    (TooManyWaiting, 429, EXIT_FAILED, "too_many_waiting"),
    (DoorFull, 503, EXIT_FAILED, "door_full"),
    (StorageFull, 507, EXIT_FAILED, "storage_full"),
    (StorageUnavailable, 503, EXIT_FAILED, "storage_unavailable"),
    (StoreError, 500, EXIT_FAILED, "state_error"),
    (DropboxEvalError, 500, EXIT_FAILED, "error"),
)


def answer_for(error: DropboxEvalError) -> tuple[int, int, str]:
    """(HTTP status, CLI exit code, reason code) of an error: the one table for both."""
    for kind, http_status, exit_code, reason in _ANSWERS:
        if isinstance(error, kind):
            if isinstance(error, BatchRejected):
                return REJECTION_HTTP_STATUS.get(error.reason, 422), exit_code, error.reason
            if isinstance(error, Conflict):
                return http_status, exit_code, error.reason
            return http_status, exit_code, reason
    raise AssertionError("DropboxEvalError is the last row")


def error_document(error: DropboxEvalError) -> dict[str, Any]:
    """`{"ok": false, "reason", "message", ...}`: the API's answer to an error and what the
    command line prints for it under `--json`."""
    _, _, reason = answer_for(error)
    body: dict[str, Any] = {"ok": False, "reason": reason, "message": str(error)}
    if isinstance(error, BatchRejected):
        body.update(error.as_dict())
    elif isinstance(error, Conflict):
        body.update(error.details)
    elif isinstance(error, StorageUnavailable):
        body["path"] = error.path
    return body
