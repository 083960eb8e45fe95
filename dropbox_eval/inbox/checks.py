"""What the inbox checks of a drop before it touches any state: its name, its bytes (the
one parser, batchfile.parse_batch), and the client it is for. `dropbox-eval validate`
makes the same checks with these same functions."""

from __future__ import annotations

from ..errors import BatchRejected
from ..models import BatchFile, is_valid_id
from ..protocol.batchfile import parse_batch
from ..protocol.batchlines import parse_batch_lines
from ..protocol.cancelfile import cancel_request_of
from ..util.printable import unprintable_reason

__all__ = ["cancel_request_of", "cancel_target", "name_problem", "read_drop"]


def read_drop(
    raw: bytes,
    folder_client: str | None,
    *,
    max_bytes: int,
    max_tasks: int,
    lines: bool = False,
) -> tuple[BatchFile, str]:
    """The batch in a drop's bytes (JSON Lines with `lines`) and the client it is for: the
    folder's (`folder_client`, None at the top of the inbox) or its own `client_id`;
    BatchRejected otherwise."""
    parse = parse_batch_lines if lines else parse_batch
    batch = parse(raw, max_bytes=max_bytes, max_tasks=max_tasks)
    client_id = folder_client or batch.client_id
    if client_id is None:
        raise BatchRejected(
            "missing_client_id",
            "client_id is required for files dropped at the top of the inbox "
            "(or drop the file into inbox/<client_id>/)",
            field="client_id",
        )
    if folder_client is not None and not is_valid_id(folder_client):
        raise BatchRejected(
            "invalid_batch",
            f"folder name {folder_client!r} is not a valid client id",
            field="client_id",
        )
    return batch, client_id


def cancel_target(batch_id: str, folder_client: str | None) -> tuple[str, str]:
    """(batch id, client id) of a cancel request (protocol/cancelfile.py) in a client's
    folder; BatchRejected at the top of the inbox."""
    if folder_client is None:
        raise BatchRejected(
            "missing_client_id",
            "cancel files go in the client's folder, inbox/<client_id>/cancel-<batch_id>.json",
        )
    return batch_id, folder_client


def name_problem(name: str) -> str | None:
    """Why a file name decoded from the file system cannot be taken: not UTF-8, or holding
    a control character (a newline would forge log lines); None when it can."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the file name is not valid UTF-8"
    return unprintable_reason(name)
