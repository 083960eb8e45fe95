"""Gitea-shaped API errors raised by the sandbox state and routes."""

from __future__ import annotations


class SandboxApiError(Exception):
    """An API error that is answered as a Gitea-style JSON body, or with no body at all
    when `bare` (a handler's `ctx.Status(code)`)."""

    def __init__(
        self,
        status: int,
        message: str,
        extra: dict[str, object] | None = None,
        *,
        bare: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra or {}
        self.bare = bare


class SandboxNotFound(SandboxApiError):
    """404 with Gitea's `{"errors": null, "message": "not found"}` body (`errors` lists
    the error's text when `APIErrorNotFound` is given one)."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__(404, "not found", {"errors": [error]} if error else None)


def error_body(
    status: int, message: str, base_url: str, extra: dict[str, object] | None = None
) -> dict[str, object]:
    """Return the JSON body Gitea sends for an error with this status."""
    url = f"{base_url}/api/swagger"
    if status == 404:
        return {"errors": None, "message": message, "url": url, **(extra or {})}
    return {"message": message, "url": url, **(extra or {})}
