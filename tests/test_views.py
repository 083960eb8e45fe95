"""One view of a batch everywhere: the CLI, the API, the page and `watch` show
the same progress, settling included, and every time as RFC 3339 UTC with `Z`."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import pytest
import requests
from conftest import Cli, isolated_cli, read_json, served
from helpers import finish_issues

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings
from dropbox_eval.sandbox import SandboxForge

RFC3339_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
TIME_FIELDS = re.compile(r"(_at|deadline)$")
KEY = "operator-key-for-views"


@pytest.fixture
def cli(tmp_path: Any, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    made = isolated_cli(tmp_path, forge, monkeypatch)
    monkeypatch.setenv("SAAS_EVAL_SETTLE_SECONDS", "600")  # closed issues stay settling
    monkeypatch.setenv("SAAS_EVAL_OPERATOR_KEY", KEY)
    return made


def web(cli: Cli) -> contextlib.AbstractContextManager[str]:
    """The HTTP server over the CLI's home, as `serve` would run it."""
    settings = load_settings(home=cli.home, gitea_url=cli.forge.url, owner=cli.forge.user)
    return served(build_app(settings))


def times_in(data: Any) -> list[str]:
    """Every non-null time field, anywhere in a JSON document."""
    if isinstance(data, list):
        return [t for item in data for t in times_in(item)]
    if not isinstance(data, dict):
        return []
    found = [v for k, v in data.items() if TIME_FIELDS.search(k) and isinstance(v, str)]
    return found + [t for v in data.values() for t in times_in(v)]


def as_json(cli: Cli, *args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code in (0, 3), result.output
    return json.loads(result.stdout)


def _close(cli: Cli, batch_id: str, count: int) -> None:
    finish_issues(cli.forge, as_json(cli, "batch", batch_id)["repo"], count=count)


def test_progress_shows_settling_the_same_everywhere(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(3)
    _close(cli, batch_id, 2)
    assert cli("poll").exit_code == 0  # the lane closed two issues: their results settle

    shown = as_json(cli, "batch", batch_id)
    expected = {"total": 3, "done": 0, "settling": 2, "waiting": 1, "text": "0/3 done, 2 settling"}
    assert {k: shown["progress"][k] for k in expected} == expected
    assert [t["settling"] for t in shown["tasks"]].count(True) == 2
    assert "settling_tasks" not in shown
    row = next(r for r in as_json(cli, "batches") if r["batch_id"] == batch_id)
    assert row["progress"]["settling"] == 2 and row["progress"]["text"] == expected["text"]
    assert "2 settling" in cli("batch", batch_id).output
    assert "##~~~~~~~-" not in cli("batches").output and "~~" in cli("batches").output
    watched = cli("watch", batch_id, "--interval", "0.05")  # no service: one line, exit 1
    assert f"{batch_id}: running, 0/3 done, 2 settling" in watched.output

    key = as_json(cli, "clients", "api-key", "acme")["api_key"]
    with web(cli) as url:
        auth = {"Authorization": f"Bearer {key}"}
        api = requests.get(f"{url}/api/eval/batches/{batch_id}", headers=auth, timeout=10).json()
        listed = requests.get(f"{url}/api/eval/batches", headers=auth, timeout=10).json()
        page = requests.post(f"{url}/operator/login", data={"key": KEY}, timeout=30).text
    assert api["progress"] == shown["progress"]
    assert api == {k: v for k, v in shown.items() if k not in ("source", "sha256")}
    assert listed[0]["progress"] == row["progress"]
    assert "0/3 done, 2 settling" in page


def test_an_ended_batch_has_nothing_settling(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(2)
    _close(cli, batch_id, 2)
    cli("poll")
    assert as_json(cli, "batch", batch_id)["progress"]["settling"] == 2
    monkeypatch.setenv("SAAS_EVAL_SETTLE_SECONDS", "0")  # the results are final now
    assert cli("run", "--once").exit_code == 0
    shown = as_json(cli, "batch", batch_id)
    assert shown["status"] == "emitted"
    assert shown["progress"] == {
        "total": 2,
        "done": 2,
        "settling": 0,
        "waiting": 0,
        "lane_done": 2,
        "percent": 100,
        "text": "2/2 done",
    }
    row = next(r for r in as_json(cli, "batches") if r["batch_id"] == batch_id)
    assert row["progress"]["settling"] == 0


def test_every_time_shown_is_rfc3339_utc_with_z(cli: Cli) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(1)
    _close(cli, batch_id, 1)
    cli("poll")
    key = as_json(cli, "clients", "api-key", "acme")["api_key"]
    documents = [
        as_json(cli, "batch", batch_id),
        as_json(cli, "batches"),
        as_json(cli, "clients", "list"),
        as_json(cli, "clients", "show", "acme"),
        as_json(cli, "status"),
    ]
    receipt = next((cli.home / "inbox" / "accepted").glob("*.receipt.json"))
    documents.append(read_json(receipt))
    with web(cli) as url:
        auth = {"Authorization": f"Bearer {key}"}
        documents.append(
            requests.get(f"{url}/api/eval/batches/{batch_id}", headers=auth, timeout=10).json()
        )
        page = requests.post(f"{url}/operator/login", data={"key": KEY}, timeout=30).text
    shown = times_in(documents)
    assert len(shown) >= 10
    assert [t for t in shown if not RFC3339_Z.match(t)] == []
    page_times = re.findall(r"<time>([^<]*)</time>", page)
    assert page_times and all(RFC3339_Z.match(t) for t in page_times), page_times
    assert "+00:00" not in page


def test_a_client_sees_its_batch_as_the_operator_does_without_operator_fields(
    cli: Cli,
) -> None:
    cli("clients", "add", "acme", "--credits", "10")
    cli("clients", "add", "other", "--credits", "10")
    batch_id = cli.submit(2)
    key = as_json(cli, "clients", "api-key", "acme")["api_key"]
    other = as_json(cli, "clients", "api-key", "other")["api_key"]
    with web(cli) as url:
        mine = requests.get(
            f"{url}/api/eval/batches/{batch_id}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        theirs = requests.get(
            f"{url}/api/eval/batches/{batch_id}",
            headers={"Authorization": f"Bearer {other}"},
            timeout=10,
        )
    operator = as_json(cli, "batch", batch_id)
    assert mine.status_code == 200 and theirs.status_code == 404
    assert set(operator) - set(mine.json()) == {"source", "sha256"}
    assert [t["task_id"] for t in mine.json()["tasks"]] == ["t1", "t2"]
