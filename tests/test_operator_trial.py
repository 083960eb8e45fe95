"""Operator-trial defects below the CLI: redacted URLs, plain delivery errors."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import Receiver, read_json, tasks
from helpers import closed_port

from dropbox_eval.app import App
from dropbox_eval.delivery.emitter import Emitter, FileEmitter
from dropbox_eval.delivery.webhook import WebhookEmitter
from dropbox_eval.errors import DeliveryError, ForgeRetryable
from dropbox_eval.forge.client import GiteaClient
from dropbox_eval.protocol.callbacks import CallbackPolicy
from dropbox_eval.store.paging import newest_page
from dropbox_eval.util.redact import shown_url

REPORT = {"batch_id": "b-1", "tasks": []}


def _emitter(tmp_path: Path) -> Emitter:
    webhooks = WebhookEmitter(timeout=30)
    return Emitter(FileEmitter(tmp_path / "outbox"), webhooks, CallbackPolicy("127.0.0.1"))


def test_shown_url_masks_user_info_only() -> None:
    assert shown_url("http://user:pw@example.com/h?q=1") == "http://***@example.com/h?q=1"
    assert shown_url("https://tok@a@example.com:8443") == "https://***@example.com:8443"
    assert shown_url("http://example.com/a@b") == "http://example.com/a@b"
    assert shown_url("not a url") == "not a url"


def test_a_callback_url_with_credentials_is_never_echoed(
    app: App, funded: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = app.inbox.root / "cb.json"
    url = "http://user:s3cret@example.com/h"
    path.write_text(json.dumps({"client_id": funded, "tasks": tasks(1), "callback_url": url}))
    with caplog.at_level(logging.DEBUG, logger="dropbox_eval"):
        assert app.inbox.process(path).status == "rejected"
    error = read_json(app.inbox.root / "rejected" / "cb.json.error.json")
    assert error["reason"] == "callback_refused"
    assert "http://***@example.com/h" in error["message"]
    stored = (app.settings.state_path / "rejections.jsonl").read_text("utf-8")
    for where in (json.dumps(error), stored, caplog.text):
        assert "s3cret" not in where and "user:s" not in where


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_a_refused_connection_is_a_plain_message(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/hook"
    with pytest.raises(DeliveryError) as caught:
        _emitter(tmp_path).deliver(REPORT, url)
    assert str(caught.value) == f"callback {url} unreachable: connection refused"


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_a_tls_failure_is_a_plain_message(tmp_path: Path, receiver: Receiver) -> None:
    url = receiver.url.replace("http://", "https://")  # a plain-HTTP server behind https
    with pytest.raises(DeliveryError) as caught:
        _emitter(tmp_path).deliver(REPORT, url)
    message = str(caught.value)
    # the OpenSSL build words the reason ("wrong version number"); plain words either way
    assert re.fullmatch(rf"callback {re.escape(url)} unreachable: TLS error: [a-z ]+", message)
    assert "Connection(" not in message and "attempts" not in message


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("", "should have at least 1 character, not 0"),
        ("x" * 300, "at most 255 characters, not 300"),
    ],
)
def test_string_length_errors_count_characters(
    app: App, funded: str, title: str, expected: str
) -> None:
    path = app.inbox.root / "long.json"
    task = {**tasks(1)[0], "title": title}
    path.write_text(json.dumps({"client_id": funded, "tasks": [task]}))
    assert app.inbox.process(path).status == "rejected"
    error = read_json(app.inbox.root / "rejected" / "long.json.error.json")
    assert error["message"].startswith("tasks.0.title: ") and expected in error["message"]
    assert "item" not in json.dumps(error)


def test_an_unreachable_forge_is_a_plain_message() -> None:
    client = GiteaClient(f"http://127.0.0.1:{closed_port()}", "token")
    with pytest.raises(ForgeRetryable) as caught:
        client.version()
    assert str(caught.value) == "GET /version: forge unreachable (connection refused)"


def test_a_page_is_the_live_then_the_newest_ended_and_reads_only_the_page() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def row(n: int, created: int, archived: int) -> dict[str, object]:
        at = start + timedelta(seconds=created)
        return {
            "batch_id": f"{at:%Y%m%d-%H%M%S}-000{n:06d}",
            "client_id": "acme",
            "status": "emitted",
            "created_at": at.isoformat(),
            "archived_at": (start + timedelta(seconds=archived)).isoformat(),
        }

    # 1,000 batches all created before any ended (each overlaps every other), then one
    # created first and archived last
    archive = [row(n, 10 + n, 2000 + n) for n in range(1000)] + [row(9999, 0, 3000)]
    read: list[dict[str, object]] = []

    def newest_first() -> Iterator[dict[str, object]]:
        for item in reversed(archive):
            read.append(item)
            yield item

    live = [row(5000, 2100, 0) | {"status": "running", "archived_at": None}]
    page = newest_page(live, newest_first(), lambda r: True, limit=3)
    assert [r["batch_id"] for r in page] == [
        live[0]["batch_id"],
        archive[-1]["batch_id"],  # ended last: first of the history, though created first
        archive[999]["batch_id"],
    ]
    assert "archived_at" not in page[1] and len(read) == 2  # not the 1,001 rows
    after = newest_page(
        live, iter(archive[::-1]), lambda r: True, limit=2, after=page[1]["batch_id"]
    )
    assert [r["batch_id"] for r in after] == [archive[999]["batch_id"], archive[998]["batch_id"]]
    oldest_id = archive[-1]["batch_id"]
    only_old = newest_page([], iter(archive[::-1]), lambda r: r["batch_id"] == oldest_id, limit=1)
    assert [r["batch_id"] for r in only_old] == [oldest_id]
