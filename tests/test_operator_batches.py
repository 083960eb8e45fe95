"""The operator's batch pages over real HTTP: one batch with its tasks and links,
Cancel behind a confirmation and the CSRF token, the list of ended batches paged from the
archive, and the available-credits column. The same pages in Chromium:
test_operator_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from conftest import OPERATOR_KEY, database_env, tasks
from fastapi import FastAPI
from helpers import finish_issues

from dropbox_eval.app import App, service_for
from dropbox_eval.sandbox import SandboxForge

Signed = tuple[str, requests.Session, str]  # base URL, signed-in session, CSRF token


@pytest.fixture
def signed(operator_web: tuple[str, FastAPI]) -> Iterator[Signed]:
    """The web app, a session signed in to its page, and that session's CSRF token."""
    url, _ = operator_web
    session = requests.Session()
    page = session.post(f"{url}/operator/login", data={"key": OPERATOR_KEY}, timeout=30)
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found
    yield url, session, found.group(1)
    session.close()


def _hrefs(html: str, css_class: str) -> list[str]:
    return re.findall(rf'<a class="{css_class}" href="([^"]+)"', html)


def _finish(app: App, forge: SandboxForge, batch_id: str, labels: list[str]) -> None:
    finish_issues(forge, app.store.get_batch(batch_id).repo, labels, comment="done")


def test_the_batch_page_shows_tasks_links_attempts_and_delivery(
    app: App, forge: SandboxForge, funded: str, signed: Signed
) -> None:
    url, session, _ = signed
    batch_id = app.intake.submit_batch(funded, tasks(3), batch_ref="night")["batch_id"]
    repo = app.store.get_batch(batch_id).repo
    owner, name = repo.split("/")
    first, second, _ = (i["number"] for i in forge.issues(owner, name))
    pull = forge.state.create_pull(
        owner, name, "lane-bot", head="lane/1", base="main", title="Fix", body=f"Fixes #{first}"
    )
    forge.state.merge_pull(owner, name, pull["number"], "lane-bot")
    forge.finish_issue(owner, name, second, comment="no", labels=["eval-fail"])
    app.poller.poll_completed(batch_id)
    app.store.update_batch(batch_id, attempts=2, last_error="forge answered 503")

    page = session.get(f"{url}/operator/batches/{batch_id}", timeout=30)
    assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
    base = app.settings.gitea_url
    assert base and base.startswith("http://127.0.0.1:")
    assert f'id="repo-link" href="{base}/{repo}"' in page.text
    issues = _hrefs(page.text, "issue")
    numbers = [t.issue_number for t in app.store.get_tasks(batch_id)]
    assert issues == [f"{base}/{repo}/issues/{n}" for n in numbers] and len(issues) == 3
    assert _hrefs(page.text, "pull") == [f"{base}/{repo}/pulls/{pull['number']}"]
    assert "2/3 done" in page.text and "night" in page.text
    assert "forge answered 503" in page.text and 'id="attempt-count">2<' in page.text
    assert "Delivery: waiting" in page.text and "the outbox" in page.text
    assert 'action="/operator/batches/' + batch_id + '/cancel"' in page.text
    assert 'http-equiv="refresh"' in page.text  # a running batch's page follows it
    assert "/retry" not in page.text  # Retry is for failed or expired batches

    overview = session.get(f"{url}/operator", timeout=30)
    assert f'<a href="/operator/batches/{batch_id}">' in overview.text


def test_unknown_batches_and_other_clients_scope_answer_404_and_strangers_401(
    app: App, funded: str, signed: Signed
) -> None:
    url, session, _ = signed
    app.billing.add_client("beta", 10)
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    for path in ("20990101-000000-nothing", "a%00b", "..%2Fstate"):
        missing = session.get(f"{url}/operator/batches/{path}", timeout=30)
        assert missing.status_code == 404 and funded not in missing.text
    scoped = session.get(f"{url}/operator/batches/{batch_id}?client=beta", timeout=30)
    assert scoped.status_code == 404 and funded not in scoped.text
    own = session.get(f"{url}/operator/batches/{batch_id}?client={funded}", timeout=30)
    assert own.status_code == 200
    stranger = requests.get(f"{url}/operator/batches/{batch_id}", timeout=30)
    assert stranger.status_code == 401 and batch_id not in stranger.text
    listing = requests.get(f"{url}/operator/batches", timeout=30)
    assert listing.status_code == 401 and funded not in listing.text


def test_cancel_asks_to_confirm_and_needs_the_csrf_token(
    app: App, forge: SandboxForge, funded: str, signed: Signed
) -> None:
    url, session, csrf = signed
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    action = f"{url}/operator/batches/{batch_id}/cancel"
    assert requests.post(action, data={"csrf": csrf, "confirm": "yes"}, timeout=30).status_code == (
        401
    )
    stale = session.post(action, data={"csrf": "stale", "confirm": "yes"}, timeout=30)
    assert stale.status_code == 403
    asked = session.post(action, data={"csrf": csrf}, timeout=30)
    assert asked.status_code == 200 and "Yes, cancel the batch" in asked.text
    assert app.store.get_batch(batch_id).status == "running"  # asking changed nothing

    done = session.post(action, data={"csrf": csrf, "confirm": "yes"}, timeout=30)
    assert done.status_code == 200 and done.url == f"{url}/operator/batches/{batch_id}"
    assert f"{batch_id}: cancelled, charged 0" in done.text
    assert app.store.get_batch(batch_id).status == "cancelled"
    owner, name = app.store.get_batch(batch_id).repo.split("/")
    assert all(i["state"] == "closed" for i in forge.issues(owner, name))
    again = session.post(action, data={"csrf": csrf, "confirm": "yes"}, timeout=30)
    assert f"{batch_id}: not cancelled: batch {batch_id} is cancelled" in again.text


def test_redeliver_from_the_batch_page_comes_back_to_it(
    app: App, forge: SandboxForge, funded: str, signed: Signed
) -> None:
    url, session, csrf = signed
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    _finish(app, forge, batch_id, ["eval-pass"])
    service_for(app).run(once=True)
    report = app.settings.outbox_path / f"{batch_id}.json"
    assert report.exists()
    report.unlink()
    page = session.get(f"{url}/operator/batches/{batch_id}", timeout=30)
    assert "Delivery: delivered" in page.text and 'name="back" value="batch"' in page.text
    assert 'http-equiv="refresh"' not in page.text
    again = session.post(
        f"{url}/operator/batches/{batch_id}/deliver",
        data={"csrf": csrf, "back": "batch"},
        timeout=30,
    )
    assert again.url == f"{url}/operator/batches/{batch_id}"
    assert f"{batch_id}: delivered to" in again.text
    assert json.loads(report.read_text())["batch_id"] == batch_id


def test_ended_batches_are_listed_filtered_and_paged_from_the_archive(
    app: App, forge: SandboxForge, funded: str, signed: Signed
) -> None:
    url, session, _ = signed
    app.billing.add_client("beta", 100)
    made: dict[str, list[str]] = {funded: [], "beta": []}
    for n in range(3):
        for client in made:
            made[client].append(
                app.intake.submit_batch(client, tasks(1), batch_ref=f"r{n}")["batch_id"]
            )
    for batch_id in made[funded] + made["beta"][:2]:
        _finish(app, forge, batch_id, ["eval-pass"])
    service_for(app).run(once=True)  # five emitted and archived, one of beta's still running
    cancelled = made["beta"][2]
    app.lifecycle.cancel(cancelled)  # ended, its report not delivered yet: still live
    running = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    assert len(app.store.list_batches(live_only=True)) == 2

    every = session.get(f"{url}/operator/batches", timeout=30)
    assert every.status_code == 200 and "6 batches, page 1 of 1" in every.text
    assert running not in every.text and cancelled in every.text
    shown = re.findall(r'<tr data-batch="([^"]+)"', every.text)
    archived = [row.batch_id for row in app.store.history_page(limit=10).rows]
    assert sorted(archived) == sorted(made[funded] + made["beta"][:2])
    assert shown == [cancelled, *archived]  # the live first, then the newest ended first

    beta = session.get(f"{url}/operator/batches", params={"client": "beta"}, timeout=30)
    beta_archived = [b for b in archived if b in made["beta"]]
    assert re.findall(r'<tr data-batch="([^"]+)"', beta.text) == [cancelled, *beta_archived]
    assert f'href="/operator/batches/{cancelled}?client=beta"' in beta.text
    assert "<option selected>beta</option>" in beta.text
    status = session.get(
        f"{url}/operator/batches", params={"client": "beta", "status": "cancelled"}, timeout=30
    )
    assert re.findall(r'<tr data-batch="([^"]+)"', status.text) == [cancelled]
    assert "1 batch, page 1 of 1" in status.text

    paged = session.get(f"{url}/operator/batches", params={"limit": 4, "page": 2}, timeout=30)
    assert "6 batches, page 2 of 2" in paged.text
    assert re.findall(r'<tr data-batch="([^"]+)"', paged.text) == [cancelled, *archived][4:]
    assert 'rel="prev" href="/operator/batches?limit=4&amp;page=1"' in paged.text
    for bad in ({"status": "running"}, {"status": "nope"}, {"client": "../x"}, {"page": 0}):
        refused = session.get(f"{url}/operator/batches", params=bad, timeout=30)
        assert refused.status_code == 400


def test_the_clients_table_shows_available_credits_as_the_cli_does(
    app: App, funded: str, signed: Signed
) -> None:
    url, session, _ = signed
    app.intake.submit_batch(funded, tasks(3))  # holds 3 credits
    env = {"SAAS_EVAL_HOME": str(app.settings.home), "PATH": "/usr/bin:/bin", **database_env()}
    listed = subprocess.run(
        [sys.executable, "-m", "dropbox_eval", "clients", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=app.settings.home,
    )
    (cli_row,) = json.loads(listed.stdout)
    assert cli_row["available"] == 100 - 3 * app.settings.task_price
    page = session.get(f"{url}/operator", timeout=30).text
    row = re.search(rf'<tr data-client="{funded}">(.*?)</tr>', page)
    assert row and f'<td class="available">{cli_row["available"]}</td>' in row.group(1)
    assert "<th>available</th>" in page


def test_a_filter_few_rows_pass_stops_reading_at_its_oldest_match() -> None:
    from dropbox_eval.store.paging import newest_page

    archive = [
        {
            "batch_id": f"20260101-000000-{n:09d}",
            "client_id": "acme",
            "status": "failed" if n in (700, 900) else "emitted",
            "created_at": f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}+00:00",
        }
        for n in range(1000)
    ]
    read: list[dict[str, object]] = []

    def newest_first() -> Iterator[dict[str, object]]:
        for item in reversed(archive):
            read.append(item)
            yield item

    def failed(row: dict[str, object]) -> bool:
        return row["status"] == "failed"

    page = newest_page([], newest_first(), failed, limit=5, matches=2)
    assert [r["batch_id"] for r in page] == [archive[900]["batch_id"], archive[700]["batch_id"]]
    assert len(read) == 300  # back to the oldest match, not the 1,000 rows
    read.clear()
    assert newest_page([], newest_first(), failed, limit=5, matches=0) == [] and read == []
    unknown = newest_page([], newest_first(), failed, limit=5)  # no count: the whole archive
    assert len(unknown) == 2 and len(read) == 1000


def test_a_failed_batch_offers_retry_and_finishes_one_a_crash_interrupted(
    app: App, forge: SandboxForge, funded: str, signed: Signed
) -> None:
    url, session, csrf = signed
    batch_id = app.intake.submit_batch(funded, tasks(2))["batch_id"]
    app.lifecycle.fail(batch_id, "the forge refused the request")
    path = f"{url}/operator/batches/{batch_id}"
    assert f'action="/operator/batches/{batch_id}/retry"' in session.get(path, timeout=30).text
    reserved = "20990101-000000-000abcdef"  # what a kill after retry's first write leaves
    app.store.update_batch(batch_id, retried_by=reserved)
    page = session.get(path, timeout=30).text
    assert f"/{batch_id}/retry" in page and "interrupted" in page and 'id="retried-by"' not in page
    overview = session.get(f"{url}/operator", timeout=30).text
    assert f'action="/operator/batches/{batch_id}/retry"' in overview
    done = session.post(f"{path}/retry", data={"csrf": csrf, "back": "batch"}, timeout=30)
    assert done.status_code == 200 and f"retried by batch {reserved}" in done.text
    assert app.store.get_batch(reserved).retry_of == batch_id
    page = session.get(path, timeout=30).text
    assert 'id="retried-by"' in page and f'href="/operator/batches/{reserved}"' in page
    assert f"/{batch_id}/retry" not in page
