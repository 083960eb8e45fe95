"""The operator page's door: who is signed in, what a form may do, how pages are rendered.

Shared by the overview (page.py) and the batch pages (batchpage.py): the session of a
request's cookie, the login page, the refusal of a form without a live session (401) or
with a stale CSRF token (403), and the one-time note a form leaves for the next view.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from ..errors import DropboxEvalError
from .headers import STYLE
from .session import OperatorSessions, Session, operator_key_id

if TYPE_CHECKING:
    from ..config import Settings
    from ..store import Store

COOKIE = "dropbox_eval_operator"
templates = Environment(
    loader=PackageLoader("dropbox_eval.web", "templates"), autoescape=select_autoescape()
)
templates.globals["style"] = STYLE


log = logging.getLogger("dropbox_eval")


class Door:
    """The sessions of one web app, the settings holding the operator key, and the store
    whose audit log records what the forms did."""

    def __init__(self, sessions: OperatorSessions, settings: Settings, store: Store) -> None:
        self.sessions = sessions
        self.settings = settings
        self.store = store

    def record(
        self, request: Request, action: str, target: str, result: str = "ok", **detail: Any
    ) -> None:
        """Append a form's action to the audit log, as the signed-in operator; a log that
        cannot be written is a warning (the action happened)."""
        session = self.session_of(request)
        try:
            self.store.record_action(
                action,
                target,
                actor=session.operator if session else "operator",
                via="page",
                result=result,
                key_id=operator_key_id(self.settings.operator_key),
                **detail,
            )
        except (DropboxEvalError, OSError) as exc:
            log.warning("audit log: %s on %s not recorded: %s", action, target, exc)

    def session_of(self, request: Request) -> Session | None:
        """The live session of the request's cookie, if any."""
        return self.sessions.find(request.cookies.get(COOKIE), self.settings.operator_key)

    def login_page(
        self, message: str, status: int, headers: dict[str, str] | None = None
    ) -> HTMLResponse:
        """The sign-in form (or why the page is off), with `message`."""
        html = templates.get_template("login.html").render(
            message=message, configured=bool(self.settings.operator_key)
        )
        return HTMLResponse(html, status_code=status, headers=headers)

    async def refusal(self, request: Request) -> Response | None:
        """Why a form post may not act: no session (401), or a session whose form carries
        a missing or stale CSRF token (403: the page was loaded before a new sign-in)."""
        session = self.session_of(request)
        if session is None:
            return self.login_page("sign in first", 401)
        if not session.allows((await form_of(request)).get("csrf")):
            return self.login_page("this form is out of date: reload the page and try again", 403)
        return None

    def done(self, request: Request, note: str, where: str) -> Response:
        """After a form acted: keep its outcome for the next view, then go to `where` (a
        path of ours, never taken from the request)."""
        self.sessions.post_note(request.cookies.get(COOKIE), note)
        return RedirectResponse(where, status_code=303)

    def render(self, request: Request, name: str, status: int = 200, **view: Any) -> Response:
        """A signed-in page from template `name` (the caller checked the session)."""
        session = self.session_of(request)
        html = templates.get_template(name).render(
            **view,
            note=self.sessions.take_note(request.cookies.get(COOKIE)),
            csrf=session.csrf if session else "",
        )
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


async def form_of(request: Request) -> dict[str, str]:
    """The first value of each field of a urlencoded form (no python-multipart needed)."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    return {name: values[0] for name, values in form.items() if values}
