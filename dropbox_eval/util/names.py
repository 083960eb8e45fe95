"""The names the inbox, the outbox and the SFTP view give a meaning of their own, and the one
rule that keeps client ids off them.

A client's folder is `inbox/<client_id>/` and its SFTP root; the same inbox holds the filing
folders of top-level drops (`inbox/accepted/`, `inbox/rejected/`) and the outbox keeps
`outbox/undelivered/`. A client id that named one of those would own another tenant's files,
so such ids are refused everywhere a client id comes in: `clients add`, a batch's
`client_id`, a client folder in the inbox, the HTTP API and SFTP logins. The comparison
ignores case (`Accepted` is the same folder on a case-insensitive share).
"""

from __future__ import annotations

from ..errors import BatchRejected

OUTCOME_DIRS = ("accepted", "rejected")
"""Beside every drop: where it is filed with its receipt or error file."""
UNDELIVERED_DIR = "undelivered"
"""`outbox/undelivered/`: reports whose callback failed, kept for the next attempt."""
REPORTS_DIR = "reports"
"""Reserved for a read-only view of a client's reports beside `accepted/` and `rejected/`."""
TEMP_SUFFIXES = (".filepart", ".part", ".tmp", ".writing", ".partial", ".crdownload")
"""Upload names the inbox leaves alone until they are renamed (they do not end in `.json`)."""
DROP_SUFFIX = ".json"
"""The suffix of a name the inbox reads (any case)."""

RESERVED_CLIENT_IDS = frozenset({*OUTCOME_DIRS, UNDELIVERED_DIR, REPORTS_DIR})
"""Client ids that are refused, compared case-insensitively (see `reserved_reason`)."""


def reserved_reason(client_id: str) -> str | None:
    """Why `client_id` cannot name a client, or None when it can.

    Refused: the folder names in RESERVED_CLIENT_IDS in any case, and names ending like a
    file the inbox reads or waits for (`*.json`, `*.part`, ...): at the top of the inbox
    such a folder would look like a drop or an upload in progress.
    """
    lowered = client_id.casefold()
    if lowered in RESERVED_CLIENT_IDS:
        return (
            f"client id {client_id!r} is reserved: the inbox, the outbox and the SFTP view "
            f"use {', '.join(sorted(RESERVED_CLIENT_IDS))} (any case) for their own folders"
        )
    suffix = next((s for s in (DROP_SUFFIX, *TEMP_SUFFIXES) if lowered.endswith(s)), None)
    if suffix is not None:
        return (
            f"client id {client_id!r} is reserved: a folder name ending in {suffix!r} "
            "looks like a drop or an upload in progress at the top of the inbox"
        )
    return None


def is_reserved_client_id(client_id: str) -> bool:
    """Whether `client_id` is refused by `reserved_reason`."""
    return reserved_reason(client_id) is not None


def refuse_reserved(client_id: str | None) -> None:
    """Raise BatchRejected(`reserved_client_id`) for a batch named for a reserved client id
    (a file's `client_id`, or the client an API key or a folder stands for)."""
    why = None if client_id is None else reserved_reason(client_id)
    if why is not None:
        raise BatchRejected(
            "reserved_client_id",
            f"{why}; no batch is taken for it (use the client id the operator gave you)",
            field="client_id",
            client_id=client_id,
        )


def rename_advice(client_id: str, available: int) -> str:
    """What the operator does about a client stored before its id was reserved."""
    return (
        f"client {client_id!r} has a reserved id and receives no drops, API batches or "
        "SFTP logins; rename it: create a new client (`dropbox-eval clients add NEW "
        f"--credits {max(available, 0)}`) and move its credits ({available} available); "
        "its batches already running finish as before"
    )
