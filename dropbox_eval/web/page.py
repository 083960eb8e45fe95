"""The operator's status page: `/operator`, behind SAAS_EVAL_OPERATOR_KEY.

Server-rendered (Jinja2 templates shipped in the package), no JavaScript, refreshes itself.
Login: the key is posted once with the form (never taken from a URL, which logs and browser
histories keep), and opens a session (session.py) whose random token goes into an HttpOnly,
SameSite=Strict cookie (Secure over https) limited to `/operator`: the cookie never holds
the key. Sign-in attempts are throttled per source address (throttle.py). The page's forms
(re-deliver, cancel, retry, pause, resume, sign out) also carry the session's CSRF token
(door.py). Keys and tokens are compared in constant time. Its security headers come from
headers.py. Each batch's own page and the list of finished batches are in batchpage.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from ..errors import DropboxEvalError, answer_for
from ..util.timestamps import now
from ..views import Views
from .batchpage import add_batch_pages, batch_path
from .door import COOKIE, Door, form_of
from .health import Health
from .parts import WebParts
from .session import OperatorSessions, key_matches
from .throttle import LoginThrottle

REFRESH_SECONDS = 5


def add_operator_page(
    api: FastAPI, parts: WebParts, health: Health, throttle: LoginThrottle
) -> None:
    """Mount `/operator` (page, login, logout, re-deliver, retry, pause, resume, the batch
    pages) on `api`; `throttle` counts the sign-in attempts; its sessions are
    `api.state.operator_sessions`."""
    views = Views(parts.store)
    sessions = OperatorSessions()
    api.state.operator_sessions = sessions
    door = Door(sessions, parts.settings, parts.store)

    def signed_in(request: Request, key: str, name: str) -> Response:
        token, _ = sessions.open(key, name)
        response = RedirectResponse("/operator", status_code=303)
        response.set_cookie(
            COOKIE,
            token,
            max_age=int(sessions.lifetime),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/operator",
        )
        return response

    @api.get("/operator", include_in_schema=False)
    def page(request: Request) -> Response:
        if door.session_of(request) is None:
            moved = "key" in request.query_params  # an old bookmark: the key is not read
            return door.login_page(KEY_IN_URL if moved else "", 401)
        return door.render(request, "page.html", **_view(views, health), refresh=REFRESH_SECONDS)

    @api.post("/operator/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        source = request.client.host if request.client else "-"
        wait = throttle.attempt(source)  # counted as wrong until the key proves right
        if wait:  # the key is not even looked at
            message = f"too many wrong keys from your address: try again in {wait} s"
            return door.login_page(message, 429, {"Retry-After": str(wait)})
        form = await form_of(request)
        key = form.get("key", "")
        if key_matches(key, parts.settings.operator_key):
            throttle.succeeded(source)
            return signed_in(request, key, form.get("name", ""))
        wait = throttle.retry_after(source)
        later = f"; wait {wait} s before the next try" if wait else ""
        return door.login_page(f"that key is not right{later}", 401)

    @api.post("/operator/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        refused = await door.refusal(request)
        if refused is not None:
            return refused
        sessions.close(request.cookies.get(COOKIE))
        response = door.login_page("signed out", 200)
        response.delete_cookie(
            COOKIE,
            path="/operator",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @api.post("/operator/batches/{batch_id}/deliver", include_in_schema=False)
    async def deliver(batch_id: str, request: Request) -> Response:
        """Re-deliver the report (`Delivery.emit` with force, as `emit --force` and the
        API do); back to the batch's page when its form says so, else to the overview."""

        def delivered() -> str:
            result = parts.delivery.emit(batch_id, force=True)
            return f"{batch_id}: delivered to {result.get('delivered_to')}"

        back = (await form_of(request)).get("back") == "batch"
        where = batch_path(batch_id) if back else "/operator"
        failed = f"{batch_id}: not delivered"
        return await act(request, delivered, where, ("emit", batch_id), failed, force=True)

    add_batch_pages(api, door, views, parts.settings.gitea_url, parts.lifecycle.cancel)

    async def act(
        request: Request,
        action: Callable[[], str],
        where: str,
        audit: tuple[str, str],
        failed: str = "not done",
        **detail: Any,
    ) -> Response:
        """A form's action: refused without a session and its CSRF token; else run (in a
        thread), its note shown on the page it goes back to, and `audit` (action, target)
        recorded in the audit log with its result."""
        refused = await door.refusal(request)
        if refused is not None:
            return refused
        try:
            note, result = await run_in_threadpool(action), "ok"
        except DropboxEvalError as exc:  # a full or read-only state, say: a note, as others
            note, result = f"{failed}: {exc}", answer_for(exc)[2]
        await run_in_threadpool(door.record, request, *audit, result, **detail)
        return door.done(request, note, where)

    @api.post("/operator/batches/{batch_id}/retry", include_in_schema=False)
    async def retry(batch_id: str, request: Request) -> Response:
        def retried() -> str:
            receipt = parts.retries.retry(batch_id)
            new, count = receipt["batch_id"], receipt["task_count"]
            return f"{batch_id}: retried by batch {new} ({count} tasks)"

        back = (await form_of(request)).get("back") == "batch"
        where = batch_path(batch_id) if back else "/operator"
        return await act(request, retried, where, ("retry", batch_id), f"{batch_id}: not retried")

    @api.post("/operator/pause", include_in_schema=False)
    async def pause(request: Request) -> Response:
        return await act(
            request,
            lambda: f"intake paused since {parts.pause.pause(by='operator page')['since']}",
            "/operator",
            ("pause", "-"),
        )

    @api.post("/operator/resume", include_in_schema=False)
    async def resume(request: Request) -> Response:
        return await act(
            request,
            lambda: "intake resumed" if parts.pause.resume() else "intake was not paused",
            "/operator",
            ("resume", "-"),
        )


def _not_retried(views: Views, ended_badly: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed or expired batches left to act on: one retried already leaves the list
    (its retry is a batch of its own, on the list while it runs); one whose retry a crash
    interrupted stays, with Retry offered again (`retry_pending`)."""
    rows = [views.mark_pending_retry(dict(b)) for b in ended_badly]
    return [row for row in rows if not row.get("retried_by") or row["retry_pending"]]


KEY_IN_URL = (
    "the key is no longer read from the address (it stays in logs and browser history): "
    "enter it below"
)


def _view(views: Views, health: Health) -> dict[str, Any]:
    """Everything the page shows, from the read model: the live batches, the newest failed
    or expired archived ones and the clients, from one read of the index (never the
    archived history)."""
    overview = views.overview()
    return {
        "in_flight": overview.in_flight,
        "ended_badly": _not_retried(views, overview.ended_badly),
        "undelivered": overview.undelivered,
        "rejections": views.rejections(20),
        "clients": overview.clients,
        "readiness": health.readiness(),
        "service": views.service(),
        "now": now(),
    }
