"""Security headers on every answer of the HTTP server, and the operator page's policy.

Every answer says `X-Content-Type-Options: nosniff` (a browser never guesses a type),
`Referrer-Policy: no-referrer` (no URL of ours is sent to another site), `X-Frame-Options:
DENY` and a Content-Security-Policy with `frame-ancestors 'none'` (no page of ours inside
another site's frame: no clickjacking of the Re-deliver button). The operator page's
policy also allows nothing but its own stylesheet, by hash: no script at all, no inline
style but that one, forms only to itself.
"""

from __future__ import annotations

import base64
import hashlib
from importlib.resources import files

from markupsafe import Markup
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STYLE = Markup(files("dropbox_eval.web").joinpath("templates/operator.css").read_text("utf-8"))
"""The page's stylesheet, inlined by base.html and allowed by its hash."""
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode("utf-8")).digest()).decode()
PAGE_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
EVERY_ANSWER = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "content-security-policy": "frame-ancestors 'none'",
}
PAGE_PREFIX = "/operator"


class SecurityHeaders:
    """ASGI middleware adding EVERY_ANSWER to each answer, and PAGE_POLICY under /operator."""

    def __init__(self, app: ASGIApp) -> None:
        """Wraps the whole app."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the answer as it starts."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        page = str(scope.get("path", "")).startswith(PAGE_PREFIX)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in EVERY_ANSWER.items():
                    headers[name] = value
                if page:
                    headers["content-security-policy"] = PAGE_POLICY
            await send(message)

        await self.app(scope, receive, send_with_headers)
