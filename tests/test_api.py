"""The HTTP API over real loopback HTTP, and a schemathesis run over its OpenAPI document."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from conftest import read_json, tasks
from helpers import drop
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from dropbox_eval.app import App
from dropbox_eval.billing.accounts import hash_api_key
from dropbox_eval.models import Client, utcnow
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api


@pytest.fixture
def api(app: App) -> Iterator[str]:
    server = BackgroundServer(create_api(app.web), name="api")
    yield server.start()
    server.stop()


@pytest.fixture
def keys(app: App) -> dict[str, str]:
    app.billing.add_client("acme", 100)
    app.billing.add_client("poor", 1)
    return {"acme": app.billing.new_api_key("acme"), "poor": app.billing.new_api_key("poor")}


def _call(api: str, key: str, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(
        method,
        f"{api}/api/eval/batches{path}",
        timeout=30,
        headers={"Authorization": f"Bearer {key}"},
        **kwargs,
    )


def test_submit_get_list_emit_cancel(
    api: str, keys: dict[str, str], app: App, forge: SandboxForge
) -> None:
    created = _call(api, keys["acme"], "POST", "", json={"batch_ref": "r1", "tasks": tasks(2)})
    assert created.status_code == 201, created.text
    batch_id = created.json()["batch_id"]
    assert all(i["issue_number"] for i in created.json()["issues"])
    again = _call(api, keys["acme"], "POST", "", json={"batch_ref": "r1", "tasks": tasks(2)})
    assert again.status_code == 200 and again.json()["batch_id"] == batch_id
    one = _call(api, keys["acme"], "GET", f"/{batch_id}").json()
    assert one["counts"]["open"] == 2 and len(one["tasks"]) == 2
    early = _call(api, keys["acme"], "POST", f"/{batch_id}/emit")
    assert early.status_code == 409 and early.json()["reason"] == "not_finished"
    second = _call(api, keys["acme"], "POST", "", json={"batch_ref": "r2", "tasks": tasks(1)})
    newest = _call(api, keys["acme"], "GET", "", params={"limit": 1})
    listed = _call(api, keys["acme"], "GET", "", params={"limit": 1, "page": 2})
    assert listed.headers["X-Total-Count"] == newest.headers["X-Total-Count"] == "2"
    assert [b["batch_id"] for b in newest.json()] == [second.json()["batch_id"]]
    assert [b["batch_id"] for b in listed.json()] == [batch_id]  # newest first
    cancelled = _call(api, keys["acme"], "POST", f"/{batch_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert _call(api, keys["acme"], "POST", f"/{batch_id}/cancel").status_code == 409
    emitted = _call(api, keys["acme"], "POST", f"/{batch_id}/emit")
    assert emitted.status_code == 200 and emitted.json()["ok"] is True
    assert (app.settings.outbox_path / f"{batch_id}.json").exists()


def test_unfunded_is_402_and_makes_no_forge_request(
    api: str, keys: dict[str, str], forge: SandboxForge
) -> None:
    forge.clear_requests()
    answer = _call(api, keys["poor"], "POST", "", json={"tasks": tasks(3)})
    assert answer.status_code == 402
    assert answer.json()["ok"] is False and answer.json()["reason"] == "unfunded"
    assert forge.requests == []


def test_clients_are_isolated_and_keys_required(api: str, keys: dict[str, str]) -> None:
    batch_id = _call(api, keys["acme"], "POST", "", json={"tasks": tasks(1)}).json()["batch_id"]
    for method, path in (
        ("GET", f"/{batch_id}"),
        ("POST", f"/{batch_id}/emit"),
        ("POST", f"/{batch_id}/cancel"),
    ):
        assert _call(api, keys["poor"], method, path).status_code == 404
    assert _call(api, keys["poor"], "GET", "").json() == []
    assert _call(api, "wrong", "GET", "").status_code == 401
    assert requests.get(f"{api}/api/eval/batches", timeout=30).status_code == 401
    spoof = _call(api, keys["poor"], "POST", "", json={"client_id": "acme", "tasks": tasks(1)})
    assert spoof.status_code == 403 and spoof.json()["reason"] == "client_mismatch"


def test_a_reserved_client_id_is_refused(
    api: str, keys: dict[str, str], app: App, forge: SandboxForge
) -> None:
    """An id the inbox uses for its own folders is no client's: neither in the body's
    `client_id` nor as the client an API key stands for."""
    forge.clear_requests()
    claim = _call(api, keys["acme"], "POST", "", json={"client_id": "Accepted", "tasks": tasks(1)})
    assert claim.status_code == 422 and claim.json()["reason"] == "reserved_client_id"
    assert "'Accepted' is reserved" in claim.json()["message"]
    # a client stored before its id was reserved, with a key issued back then
    with app.store.transaction() as tx:
        tx.add_client(Client(client_id="rejected", created_at=utcnow()))
    app.billing.fund("rejected", 10)
    with app.store.transaction() as tx:
        tx.update_client("rejected", api_key_hashes=[hash_api_key("dek_rejected_old")])
    legacy = _call(api, "dek_rejected_old", "POST", "", json={"tasks": tasks(1)})
    assert legacy.status_code == 422 and legacy.json()["reason"] == "reserved_client_id"
    assert forge.requests == [] and app.store.count_batches() == {}


def test_invalid_batch_names_the_field(api: str, keys: dict[str, str]) -> None:
    answer = _call(
        api, keys["acme"], "POST", "", json={"tasks": [{"task_id": "../x", "title": "t"}]}
    )
    assert answer.status_code == 422
    assert answer.json()["reason"] == "invalid_batch"
    assert answer.json()["field"] == "tasks.0.task_id"


def test_api_has_no_server_errors(api: str, keys: dict[str, str]) -> None:
    """Schemathesis generates requests for every operation; none may answer 5xx."""
    schema = schemathesis.openapi.from_url(f"{api}/openapi.json")
    auth = {"Authorization": f"Bearer {keys['acme']}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 8  # the report route, retry and delete included
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def no_server_error(case: Any) -> None:
            case.call_and_validate(headers=auth, checks=[not_a_server_error])

        no_server_error()


def test_a_retried_post_is_the_same_batch(api: str, keys: dict[str, str], app: App) -> None:
    body = {"tasks": tasks(2)}
    first = _call(api, keys["acme"], "POST", "", json=body)
    again = _call(api, keys["acme"], "POST", "", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["batch_id"] == first.json()["batch_id"]
    assert app.billing.client("acme").held == 4


def test_every_api_error_is_a_problem_document_and_a_non_http_callback_is_refused(
    api: str, app: App, funded: str
) -> None:
    unknown = requests.get(f"{api}/no/such/path", timeout=30)
    assert unknown.status_code == 404 and unknown.json()["ok"] is False
    headers = {"Authorization": f"Bearer {app.billing.new_api_key(funded)}"}
    body = {"callback_url": "ftp://example.com/hook", "tasks": tasks(1)}
    answer = requests.post(f"{api}/api/eval/batches", json=body, headers=headers, timeout=30)
    assert answer.status_code == 422 and answer.json()["reason"] == "callback_refused"
    path = drop(app.inbox.root, "ftp.json", body, funded)  # the same batch by file
    app.inbox.process(path)
    assert read_json(path.with_name("rejected") / "ftp.json.error.json")["reason"] == (
        "callback_refused"
    )
