"""The operator page's Retry, Pause and Resume, in a real headless Chromium, and their
forms' sign-in and CSRF checks over plain HTTP."""

from __future__ import annotations

import pytest
import requests
from conftest import PATIENCE, served, tasks
from test_operator_browser import KEY, page  # noqa: F401 - the browser fixture

from dropbox_eval.app import App
from dropbox_eval.sandbox import SandboxForge


def _failed(app: App, forge: SandboxForge, client: str) -> str:
    forge.fail_next(1, 422, path_contains="/issues", method="POST")
    batch_id = str(app.intake.submit_batch(client, tasks(2), batch_ref="broken")["batch_id"])
    assert app.store.get_batch(batch_id).status == "failed"
    return batch_id


def test_the_page_retries_a_failed_batch_and_pauses_and_resumes(
    app: App,
    forge: SandboxForge,
    funded: str,
    page: object,  # noqa: F811 - the fixture imported above
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    expect.set_options(timeout=PATIENCE * 1000)
    app.settings.operator_key = KEY
    old = _failed(app, forge, funded)
    with served(app) as url:
        page.goto(f"{url}/operator")
        page.fill('input[name="key"]', KEY)
        page.get_by_role("button", name="Sign in").click()
        row = page.locator(f'#ended-badly tr[data-batch="{old}"]')
        row.get_by_role("button", name="Retry").click()
        new = app.store.get_batch(old).retried_by
        assert new is not None and app.store.get_batch(new).retry_of == old
        expect(page.locator("#note")).to_contain_text(f"{old}: retried by batch {new} (2 tasks)")
        expect(row).to_have_count(0)  # retried: it leaves the "Failed or expired" list

        page.get_by_role("button", name="Pause intake").click()
        since = app.pause.since()
        assert since is not None
        expect(page.locator("#paused")).to_contain_text(f"Intake paused since {since}")
        expect(page.locator("#paused")).to_contain_text("operator page")
        page.get_by_role("button", name="Resume intake").click()
        expect(page.locator("#note")).to_contain_text("intake resumed")
        expect(page.locator("#paused")).to_have_count(0)
        assert app.pause.since() is None


@pytest.mark.parametrize(
    "path", ["/operator/pause", "/operator/resume", "/operator/batches/x/retry"]
)
def test_the_new_forms_need_a_session_and_its_csrf_token(app: App, path: str) -> None:
    app.settings.operator_key = KEY
    with served(app) as url:
        anonymous = requests.post(f"{url}{path}", data={"csrf": "x"}, timeout=PATIENCE)
        assert anonymous.status_code == 401 and "sign in first" in anonymous.text
        browser = requests.Session()
        signed = browser.post(f"{url}/operator/login", data={"key": KEY}, timeout=PATIENCE)
        assert signed.status_code == 200
        stale = browser.post(f"{url}{path}", data={"csrf": "stale"}, timeout=PATIENCE)
        assert stale.status_code == 403 and "out of date" in stale.text
    assert app.pause.since() is None  # nothing was paused by a refused form
