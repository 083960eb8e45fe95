"""Names and views (issue 32): a cancel request is known by its content as well as its
name; a batch that ended early never shows a full bar; a retried batch leaves the page's
"Failed or expired" list; no output carries microseconds or `+00:00`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import OPERATOR_KEY, Cli, isolated_cli, read_json, tasks
from filelock import FileLock

from dropbox_eval.app import App
from dropbox_eval.errors import ForgeError
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.views import Views
from dropbox_eval.views.progress import Progress
from dropbox_eval.workers.status import StatusFile

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = ROOT / "examples" / "valid" / "minimal.json"
NOT_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+|[+-]\d\d:\d\d)")
"""A time with a fraction of a second or an offset: what no output may carry."""


def test_a_batch_named_like_a_cancel_request_is_a_batch(
    app: App, forge: SandboxForge, funded: str
) -> None:
    folder = app.inbox.root / funded
    folder.mkdir(parents=True)
    batch = folder / "cancel-me.json"
    batch.write_text(json.dumps({"tasks": tasks(3)}))
    taken = app.inbox.process(batch)
    assert taken.status == "accepted", taken.document
    assert taken.document["task_count"] == 3 and "cancel" not in taken.document
    batch_id = taken.document["batch_id"]
    request = folder / f"cancel-{batch_id}.json"
    request.write_text(" {\n} ")  # an empty object, JSON's whitespace around: a cancel
    cancelled = app.inbox.process(request)
    assert cancelled.status == "accepted" and cancelled.document["cancel"] is True
    assert app.store.get_batch(batch_id).status == "cancelled"


def test_validate_says_what_the_inbox_does(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli: Cli = isolated_cli(tmp_path, forge, monkeypatch)
    named = tmp_path / "cancel-me.json"
    named.write_text(json.dumps({"tasks": tasks(3)}))
    request = tmp_path / "cancel-20261201-000000-000abcdef.json"
    request.write_text("{}")
    done = cli("validate", "--client", "acme", str(named), str(request), base=False)
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        f"{named}: ok, 3 tasks for client acme",
        f"{request}: ok, a cancel request for batch 20261201-000000-000abcdef",
    ]


@pytest.mark.parametrize(("status", "lane_done", "percent"), [("failed", 0, 0), ("expired", 1, 33)])
def test_a_batch_that_ended_early_shows_what_the_lane_finished(
    status: str, lane_done: int, percent: int
) -> None:
    shown = Progress(status, total=3, done=3, lane_done=lane_done)  # type: ignore[arg-type]
    assert shown.as_dict()["percent"] == percent
    assert Progress("cancelled", total=3, done=3).percent == 0  # type: ignore[arg-type]
    assert Progress("completed", total=3, done=3, lane_done=3).percent == 100  # type: ignore[arg-type]


def test_a_failed_batch_is_not_at_100_percent_in_the_api_or_on_the_page(
    app: App, forge: SandboxForge, funded: str, operator_web: tuple[str, Any]
) -> None:
    forge.fail_next(1, 422, path_contains="/issues", method="POST")
    batch_id = str(app.intake.submit_batch(funded, tasks(2))["batch_id"])
    assert app.store.get_batch(batch_id).status == "failed"
    view = Views(app.store).batch(batch_id)
    assert (view["progress"]["lane_done"], view["progress"]["percent"]) == (0, 0)
    row = next(r for r in Views(app.store).batches() if r["batch_id"] == batch_id)
    assert row["progress"]["percent"] == 0
    url, _ = operator_web
    with requests.Session() as session:
        session.post(f"{url}/operator/login", data={"key": OPERATOR_KEY}, timeout=30)
        page = session.get(f"{url}/operator/batches/{batch_id}", timeout=30).text
    assert '<progress max="100" value="0">0%</progress>' in page


def test_a_retried_batch_leaves_the_failed_or_expired_list(
    app: App, forge: SandboxForge, funded: str, operator_web: tuple[str, Any]
) -> None:
    forge.fail_next(1, 422, path_contains="/issues", method="POST")
    old = str(app.intake.submit_batch(funded, tasks(2))["batch_id"])
    url, _ = operator_web

    def listed() -> str:
        with requests.Session() as session:
            page = session.post(f"{url}/operator/login", data={"key": OPERATOR_KEY}, timeout=30)
        section = page.text.split('<section id="ended-badly">')[1].split("</section>")[0]
        return section

    assert f'data-batch="{old}"' in listed()
    new = app.retries.retry(old)["batch_id"]
    assert f'data-batch="{old}"' not in listed() and f'data-batch="{new}"' not in listed()


def test_no_output_carries_microseconds_or_an_offset(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status --json`, the API and the page, with a service's status written by the
    service's own writer and one an older version left (microseconds, `+00:00`)."""
    cli: Cli = isolated_cli(tmp_path, forge, monkeypatch)
    monkeypatch.setenv("SAAS_EVAL_OPERATOR_KEY", OPERATOR_KEY)
    cli("clients", "add", "acme", "--credits", "10")
    batch_id = cli.submit(1)
    state = tmp_path / "state"
    status = StatusFile(state / "service.json")
    status.set(state="running", pid=1, started_at="2026-12-01T04:08:47.123456+00:00")
    status.report("forge visit", ForgeError("the forge answered 502"))  # the writer's time
    old = read_json(state / "service.json") | {  # and an older version's worker record
        "workers": {"inbox-worker": {"state": "running", "since": "2026-12-01T04:08:47.5+00:00"}}
    }
    (state / "service.json").write_text(json.dumps(old))
    key = json.loads(cli("clients", "api-key", "acme", "--json").stdout)
    api_key = key.get("api_key") or key["key"]
    from conftest import served

    from dropbox_eval.app import build_app
    from dropbox_eval.config import load_settings

    with FileLock(str(state / "service.lock")):  # held: the service "runs"
        shown = cli("status", "--json")
        settings = load_settings(home=tmp_path, gitea_url=forge.url, owner=forge.user)
        with served(build_app(settings)) as url:
            auth = {"Authorization": f"Bearer {api_key}"}
            api = requests.get(f"{url}/api/eval/batches/{batch_id}", headers=auth, timeout=30)
            with requests.Session() as session:
                page = session.post(
                    f"{url}/operator/login", data={"key": OPERATOR_KEY}, timeout=30
                ).text
    record = json.loads(shown.stdout)
    assert record["running"] is True and record["last_error"].endswith("answered 502")
    outputs = {"status": shown.stdout, "api": api.text, "page": page}
    assert {name: NOT_Z.findall(text) for name, text in outputs.items()} == dict.fromkeys(
        outputs, []
    )
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ forge visit", record["last_error"])
    assert record["workers"]["inbox-worker"]["since"] == "2026-12-01T04:08:47Z"
    assert "the forge answered 502" in page  # the page's last error is there, in `Z`
