"""The operator's status page: `/operator`, behind SAAS_EVAL_OPERATOR_KEY.

Server-rendered (Jinja2 templates shipped in the package), no JavaScript, refreshes itself.
Login: `?key=...` once, or the form; either sets an HttpOnly, SameSite=Strict cookie (which
also keeps other sites from posting the re-deliver form). Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from ..errors import DropboxEvalError
from ..models import BatchStatus, utcnow
from ..rejections import RejectionLog
from ..service import read_status
from .health import Health, service_running

if TYPE_CHECKING:
    from ..app import App

COOKIE = "dropbox_eval_operator"
REFRESH_SECONDS = 5
templates = Environment(
    loader=PackageLoader("dropbox_eval.web", "templates"), autoescape=select_autoescape()
)


def key_matches(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; no key configured means nobody gets in."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def add_operator_page(api: FastAPI, app: App, health: Health) -> None:
    """Mount `/operator` (page, login, re-deliver) on `api`."""
    rejections = RejectionLog(app.settings.state_path)

    def authorized(request: Request) -> bool:
        return key_matches(request.cookies.get(COOKIE), app.settings.operator_key)

    def login_page(message: str, status: int) -> HTMLResponse:
        html = templates.get_template("login.html").render(
            message=message, configured=bool(app.settings.operator_key)
        )
        return HTMLResponse(html, status_code=status)

    def signed_in(key: str) -> Response:
        response = RedirectResponse("/operator", status_code=303)
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict", path="/operator")
        return response

    @api.get("/operator", include_in_schema=False)
    def page(request: Request, key: str | None = None, note: str = "") -> Response:
        if key is not None:
            if key_matches(key, app.settings.operator_key):
                return signed_in(key)
            return login_page("that key is not right", 401)
        if not authorized(request):
            return login_page("", 401)
        view = _view(app, health, rejections)
        html = templates.get_template("page.html").render(
            **view, note=note, refresh=REFRESH_SECONDS
        )
        return HTMLResponse(html)

    @api.post("/operator/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        key = (form.get("key") or [""])[0]
        if key_matches(key, app.settings.operator_key):
            return signed_in(key)
        return login_page("that key is not right", 401)

    @api.post("/operator/batches/{batch_id}/deliver", include_in_schema=False)
    async def deliver(batch_id: str, request: Request) -> Response:
        if not authorized(request):
            return login_page("sign in first", 401)
        try:
            result = await run_in_threadpool(app.delivery.emit, batch_id, force=True)
            note = f"{batch_id}: delivered to {result.get('delivered_to')}"
        except DropboxEvalError as exc:
            note = f"{batch_id}: not delivered: {exc}"
        return RedirectResponse(f"/operator?note={quote(note)}", status_code=303)


def _view(app: App, health: Health, rejections: RejectionLog) -> dict[str, Any]:
    """Everything the page shows, read from the state."""
    now = utcnow()
    in_flight, ended_badly, undelivered = [], [], []
    for row in app.store.list_batches():
        bad = row["status"] in (BatchStatus.FAILED, BatchStatus.EXPIRED)
        if row.get("emitted_at") and not bad:
            continue  # delivered and fine: nothing to act on
        batch = app.store.get_batch(str(row["batch_id"]))
        item = batch.model_dump(mode="json") | {
            "age": _age(now, batch.created_at),
            "percent": round(100 * batch.done / batch.total) if batch.total else 100,
        }
        if batch.status == BatchStatus.RUNNING:
            in_flight.append(item)
            continue
        if bad:
            ended_badly.append(item)
        if batch.emitted_at is None:
            undelivered.append(item)
    clients = []
    for client in app.store.list_clients():
        charged = sum(-e.amount for e in app.store.ledger(client.client_id) if e.kind == "charge")
        clients.append(client.model_dump(mode="json") | {"charged": charged})
    return {
        "in_flight": in_flight,
        "ended_badly": ended_badly[-20:],
        "undelivered": undelivered,
        "rejections": rejections.recent(20),
        "clients": clients,
        "readiness": health.readiness(),
        "service": _service(app),
        "now": now.isoformat(timespec="seconds"),
    }


def _service(app: App) -> dict[str, Any]:
    state = app.settings.state_path
    return read_status(state) if service_running(state) else {"running": False}


def _age(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
