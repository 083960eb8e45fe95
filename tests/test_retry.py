"""Retry of a failed or expired batch, through the CLI (child processes) and the HTTP API,
against the sandbox forge; and a re-drop of a failed batch's file, refused with the hint."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import forkrun
import pytest
import requests
from conftest import PATIENCE, read_json, served, tasks
from helpers import finish_issues

from dropbox_eval.app import App
from dropbox_eval.errors import EXIT_FAILED, EXIT_REJECTED
from dropbox_eval.models import utcnow
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.engine import TinyDBStore


class Home:
    """A tmp home driven by `dropbox-eval` child processes against the sandbox forge."""

    def __init__(self, home: Path, forge: SandboxForge) -> None:
        self.home = home
        self.forge = forge

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
        env.pop("DROPBOX_EVAL_CRASH_AFTER", None)
        return env | {
            "SAAS_EVAL_HOME": str(self.home),
            "SAAS_EVAL_GITEA_URL": self.forge.url,
            "SAAS_EVAL_GITEA_TOKEN": self.forge.token,
            "SAAS_EVAL_OWNER": self.forge.user,
            "SAAS_EVAL_SETTLE_SECONDS": "0",
            "SAAS_EVAL_QUIET_PERIOD": "0",
            "SAAS_EVAL_TASK_PRICE": "1",
        }

    def run(self, *args: str) -> forkrun.Finished:
        return forkrun.run(list(args), self.env(), PATIENCE * 2)

    def json(self, *args: str, code: int = 0) -> Any:
        done = self.run(*args, "--json")
        assert done.returncode == code, (args, done.stdout, done.stderr[-3000:])
        return json.loads(done.stdout)

    def submit(self, document: dict[str, Any], name: str = "b.json", code: int = 0) -> Any:
        source = self.home / name
        source.write_text(json.dumps(document), encoding="utf-8")
        return self.json("submit", str(source), "--client", "acme", code=code)

    def failed_batch(self, count: int = 3, name: str = "b.json") -> str:
        """A batch whose first issue creation the forge refuses (422): it ends `failed`,
        every task `aborted`."""
        self.forge.fail_next(1, 422, path_contains="/issues", method="POST")
        receipt = self.submit({"batch_ref": name[:-5], "tasks": tasks(count)}, name)
        batch = self.json("batch", receipt["batch_id"])
        assert batch["status"] == "failed", batch
        return str(receipt["batch_id"])

    def finish(
        self, batch_id: str, verdicts: dict[int, str] | None = None, comment: str = "ok"
    ) -> None:
        """The lane closes the batch's open issues (`eval-pass` unless `verdicts` says),
        each with `comment`."""
        repo = self.json("batch", batch_id)["repo"]
        finish_issues(self.forge, repo, verdicts or {}, comment=comment)


@pytest.fixture
def home(tmp_path: Path, forge: SandboxForge) -> Home:
    made = Home(tmp_path, forge)
    assert made.run("clients", "add", "acme", "--credits", "20").returncode == 0
    return made


def test_retry_opens_a_linked_batch_of_the_failed_tasks_with_its_own_report(home: Home) -> None:
    old = home.failed_batch(3)
    before = home.json("clients", "show", "acme")
    receipt = home.json("retry", old)
    new = receipt["batch_id"]
    assert new != old and receipt["retry_of"] == old and receipt["task_count"] == 3
    assert receipt["held"] == 3 and receipt["status"] == "in_progress"
    assert all(i["issue_number"] is not None for i in receipt["issues"])  # opened at once
    shown_old, shown_new = home.json("batch", old), home.json("batch", new)
    assert shown_old["retried_by"] == new and shown_old["retry_of"] is None
    assert shown_new["retry_of"] == old and shown_new["retried_by"] is None
    assert [t["task_id"] for t in shown_new["tasks"]] == ["t1", "t2", "t3"]
    after = home.json("clients", "show", "acme")
    assert after["held"] == before["held"] + 3 and after["balance"] == before["balance"]
    text = home.run("batch", old).stdout
    assert f"retried by {new}" in text

    again = home.json("retry", old, code=EXIT_FAILED)
    assert again["reason"] == "already_retried" and again["retried_by"] == new
    running = home.json("retry", new, code=EXIT_FAILED)
    assert running["reason"] == "not_retryable" and "running" in running["message"]

    home.finish(new)
    assert home.run("poll", new).returncode == 0
    assert home.run("emit", new).returncode == 0
    report = read_json(home.home / "outbox" / f"{new}.json")
    assert report["retry_of"] == old and report["status"] == "completed"
    assert report["counts"]["passed"] == 3 and report["charged"] == 3
    assert "retry_of" not in read_json(home.home / "outbox" / f"{new}.json")["results"][0]
    home.run("emit", old)
    assert "retry_of" not in read_json(home.home / "outbox" / f"{old}.json")  # not a retry
    assert home.json("batch", old)["retried_by"] == new  # still linked once archived
    assert home.json("clients", "show", "acme")["held"] == 0


def test_an_expired_batch_is_retried_with_only_its_failed_and_expired_tasks(home: Home) -> None:
    batch_id = home.submit({"tasks": tasks(3)})["batch_id"]
    shown = home.json("batch", batch_id)
    owner, name = shown["repo"].split("/")
    number = {t["task_id"]: t["issue_number"] for t in shown["tasks"]}  # opened in parallel
    home.forge.finish_issue(owner, name, number["t1"], comment="ok", labels=["eval-pass"])
    home.forge.finish_issue(owner, name, number["t2"], comment="no", labels=["eval-fail"])
    assert home.run("poll", batch_id).returncode == 0
    store = TinyDBStore(home.home / "state")
    store.update_batch(batch_id, deadline=utcnow() - timedelta(seconds=1))
    assert home.run("run", "--once").returncode == 0  # the deadline passed: expired
    statuses = {t["task_id"]: t["status"] for t in home.json("batch", batch_id)["tasks"]}
    assert statuses == {"t1": "passed", "t2": "failed", "t3": "expired"}
    receipt = home.json("retry", batch_id)
    new = home.json("batch", receipt["batch_id"])
    assert [t["task_id"] for t in new["tasks"]] == ["t2", "t3"] and receipt["held"] == 2
    assert new["deadline"] > new["created_at"]  # its own deadline, from now


def test_an_unfunded_retry_is_refused_and_links_nothing(home: Home) -> None:
    old = home.failed_batch(3)
    home.submit({"tasks": tasks(18)}, "big.json")  # holds 18 of 20: 2 are available
    refused = home.json("retry", old, code=EXIT_REJECTED)
    assert refused["reason"] == "unfunded" and refused["cost"] == 3
    assert (
        refused["message"].startswith(f"retry of {old}: ") and "retry again" in refused["message"]
    )
    assert home.json("batch", old)["retried_by"] is None
    assert home.run("clients", "fund", "acme", "1").returncode == 0
    assert home.json("retry", old)["retry_of"] == old  # funded now: it goes


def test_a_completed_batch_is_not_retryable(home: Home) -> None:
    batch_id = home.submit({"tasks": tasks(1)})["batch_id"]
    home.finish(batch_id)
    assert home.run("poll", batch_id).returncode == 0
    refused = home.json("retry", batch_id, code=EXIT_FAILED)
    assert refused["reason"] == "not_retryable" and refused["status"] == "completed"
    assert home.json("retry", "20990101-000000-000abcdef", code=3)["reason"] == "not_found"


def test_a_redrop_of_a_failed_batch_is_refused_with_the_way_to_retry(home: Home) -> None:
    old = home.failed_batch(2, "nightly.json")
    again = home.submit({"batch_ref": "nightly", "tasks": tasks(2)}, "nightly.json", EXIT_REJECTED)
    assert again["reason"] == "use_retry" and again["batch_id"] == old
    assert again["status"] == "failed" and "retried_by" not in again  # none yet: omitted
    assert f"POST /api/eval/batches/{old}/retry" in again["message"]
    assert f"dropbox-eval retry {old}" in again["message"]
    rejected = home.home / "inbox" / "acme" / "rejected"
    assert read_json(rejected / "nightly.json.error.json")["reason"] == "use_retry"
    new = home.json("retry", old)["batch_id"]
    third = home.submit({"batch_ref": "nightly", "tasks": tasks(2)}, "nightly.json", EXIT_REJECTED)
    assert third["retried_by"] == new and f"retried already, by batch {new}" in third["message"]


def test_the_api_retries_only_the_callers_own_batch(app: App, forge: SandboxForge) -> None:
    app.billing.add_client("acme", 20)
    app.billing.add_client("beta", 20)
    keys = {c: app.billing.new_api_key(c) for c in ("acme", "beta")}
    forge.fail_next(1, 422, path_contains="/issues", method="POST")
    body = json.dumps({"batch_ref": "n1", "tasks": tasks(2)})
    with served(app) as url:

        def call(client: str, method: str, path: str, **kwargs: Any) -> requests.Response:
            headers = {"Authorization": f"Bearer {keys[client]}"}
            return requests.request(method, f"{url}{path}", headers=headers, timeout=PATIENCE)

        posted = requests.post(
            f"{url}/api/eval/batches",
            data=body,
            headers={"Authorization": f"Bearer {keys['acme']}"},
            timeout=PATIENCE,
        )
        old = posted.json()["batch_id"]
        assert call("acme", "GET", f"/api/eval/batches/{old}").json()["status"] == "failed"
        again = requests.post(
            f"{url}/api/eval/batches",
            data=body,
            headers={"Authorization": f"Bearer {keys['acme']}"},
            timeout=PATIENCE,
        )
        assert again.status_code == 409 and again.json()["reason"] == "use_retry"
        other = call("beta", "POST", f"/api/eval/batches/{old}/retry")
        assert other.status_code == 404 and other.json()["reason"] == "not_found"
        made = call("acme", "POST", f"/api/eval/batches/{old}/retry")
        assert made.status_code == 201, made.text
        new = made.json()["batch_id"]
        assert made.json()["retry_of"] == old and made.json()["held"] == 4
        assert call("acme", "GET", f"/api/eval/batches/{old}").json()["retried_by"] == new
        assert call("acme", "GET", f"/api/eval/batches/{new}").json()["retry_of"] == old
        twice = call("acme", "POST", f"/api/eval/batches/{old}/retry")
        assert twice.status_code == 409 and twice.json()["reason"] == "already_retried"
        assert call("acme", "POST", "/api/eval/batches/nope/retry").status_code == 404
    assert app.store.get_client("beta").held == 0  # type: ignore[union-attr]


def test_a_retry_while_paused_holds_its_credits_and_opens_its_issues_after_resume(
    home: Home,
) -> None:
    old = home.failed_batch(2)
    assert home.run("pause").returncode == 0
    said = home.run("retry", old)
    assert said.returncode == 0 and "0 of 2 issues opened" in said.stdout
    assert "after `dropbox-eval resume` (intake is paused)" in said.stdout
    new = home.json("batch", old)["retried_by"]
    assert [t["issue_number"] for t in home.json("batch", new)["tasks"]] == [None, None]
    assert home.json("clients", "show", "acme")["held"] == 2
    assert home.run("run", "--once").returncode == 0  # paused: still no issue
    assert not home.json("batch", new)["intake_done"]
    assert home.run("resume").returncode == 0
    assert home.run("run", "--once").returncode == 0
    opened = home.json("batch", new)
    assert opened["intake_done"] and all(t["issue_number"] for t in opened["tasks"])
