"""The operator page in a real headless Chromium (Debian's package, driven by Playwright).

Without a browser the test is skipped with its reason, except under CI=true, where a
missing browser is a failure (.ci/run installs it).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import PATIENCE, Receiver, tasks, wait_for

from dropbox_eval.app import App, service_for
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.fileio import write_atomically
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web

CHROMIUM = Path(os.environ.get("DROPBOX_EVAL_CHROMIUM", "/usr/bin/chromium"))
KEY = "page-key-for-the-browser"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@pytest.fixture
def page(tmp_path: Path) -> Iterator[object]:
    """A fresh headless Chromium page (own profile folder)."""
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the browser test: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 430, "height": 1100},  # a phone's width
            timeout=PATIENCE * 1000,
        )
        context.set_default_timeout(PATIENCE * 1000)  # not 30 s: a loaded machine is slow
        try:
            yield context.new_page()
        finally:
            context.close()


def test_the_page_follows_progress_and_redelivers(
    app: App, forge: SandboxForge, funded: str, receiver: Receiver, page: object, tmp_path: Path
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    expect.set_options(timeout=PATIENCE * 1000)  # each check polls up to this, not 5 s
    app.settings.operator_key = KEY
    running = app.intake.submit_batch(funded, tasks(2), batch_ref="nightly")["batch_id"]
    receiver.answers = [500] * 20  # the delivery fails: the report waits for a retry
    ended = app.intake.submit_batch(funded, tasks(1), callback_url=receiver.url)["batch_id"]
    owner, name = app.store.get_batch(ended).repo.split("/")
    forge.finish_issue(owner, name, 1, comment="done", labels=["eval-pass"])
    bad = app.settings.inbox_path / funded / "broken.json"
    bad.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(bad, "{oops")
    service_for(app).run(once=True)
    assert app.store.get_batch(ended).last_delivery_error is not None
    receiver.answers.clear()  # the receiver is back
    tried = len(receiver.received)

    server = BackgroundServer(create_web(app.web, lambda: {}))
    url = server.start()
    try:
        refused: list[str] = []  # the page's own policy must not block any of its parts
        page.on("console", lambda message: refused.append(message.text))
        page.goto(f"{url}/operator")
        page.fill('input[name="key"]', KEY)  # posted once; the session cookie does the rest
        page.get_by_role("button", name="Sign in").click()
        in_flight = page.locator(f'#in-flight tr[data-batch="{running}"]')
        expect(in_flight.locator(".done")).to_have_text("0/2 done")
        expect(page.locator("#rejections")).to_contain_text("invalid_json")
        expect(page.locator("#clients")).to_contain_text(funded)
        styled = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert styled == "rgb(246, 247, 249)"  # the stylesheet its CSP allows by hash
        assert not [m for m in refused if "Content Security Policy" in m], refused

        owner, name = app.store.get_batch(running).repo.split("/")
        first = forge.issues(owner, name)[0]["number"]
        forge.finish_issue(owner, name, first, comment="ok", labels=["eval-pass"])
        app.poller.poll_batches([running], full=True, probe=False)
        # no reload from the test: the page refreshes itself
        expect(in_flight.locator(".done")).to_have_text("1/2 done")

        row = page.locator(f'#undelivered tr[data-batch="{ended}"]')
        expect(row).to_contain_text("500")
        page.screenshot(path=str(tmp_path / "operator-page.png"), full_page=True)
        shutil.copyfile(tmp_path / "operator-page.png", "/tmp/operator-page.png")
        row.get_by_role("button", name="Re-deliver").click()
        expect(page.locator("#note")).to_contain_text(f"{ended}: delivered to {receiver.url}")
        assert wait_for(lambda: len(receiver.received) == tried + 1)
        report = json.loads(receiver.received[-1][1])
        assert report["batch_id"] == ended and report["status"] == "completed"
        expect(page.locator(f'#undelivered tr[data-batch="{ended}"]')).to_have_count(0)
    finally:
        server.stop()


def _signed_in(page: object, url: str) -> None:
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    page.goto(f"{url}/operator")
    page.fill('input[name="key"]', KEY)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#health").wait_for()


def test_the_batch_page_cancels_redelivers_and_lists_ended_batches(
    app: App, forge: SandboxForge, funded: str, page: object
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    expect.set_options(timeout=PATIENCE * 1000)
    app.settings.operator_key = KEY
    app.billing.add_client("beta", 50)
    running = app.intake.submit_batch(funded, tasks(2), batch_ref="nightly")["batch_id"]
    ended = app.intake.submit_batch("beta", tasks(1))["batch_id"]
    owner, name = app.store.get_batch(ended).repo.split("/")
    forge.finish_issue(owner, name, 1, comment="done", labels=["eval-pass"])
    service_for(app).run(once=True)  # `ended` is emitted and archived
    repo = app.store.get_batch(running).repo
    numbers = [t.issue_number for t in app.store.get_tasks(running)]

    server = BackgroundServer(create_web(app.web, lambda: {}))
    url = server.start()
    try:
        _signed_in(page, url)
        expect(page.locator(f'#clients tr[data-client="{funded}"] .available')).to_have_text(
            str(100 - 2 * app.settings.task_price)
        )
        page.locator(f'#in-flight tr[data-batch="{running}"] a').click()
        expect(page).to_have_url(f"{url}/operator/batches/{running}")
        expect(page.locator("#status")).to_have_text("running")
        expect(page.locator("#repo-link")).to_have_attribute("href", f"{forge.url}/{repo}")
        links = page.locator("#tasks a.issue")
        expect(links).to_have_count(2)
        hrefs = [links.nth(n).get_attribute("href") for n in range(2)]
        assert hrefs == [f"{forge.url}/{repo}/issues/{n}" for n in numbers]

        page.get_by_role("button", name="Cancel").click()
        expect(page.locator("#confirm")).to_contain_text("cannot be undone")
        assert app.store.get_batch(running).status == "running"  # asked, not done
        page.get_by_role("button", name="Yes, cancel the batch").click()
        expect(page).to_have_url(f"{url}/operator/batches/{running}")
        expect(page.locator("#note")).to_contain_text(f"{running}: cancelled")
        expect(page.locator("#status")).to_have_text("cancelled")
        assert app.store.get_batch(running).status == "cancelled"

        page.get_by_role("button", name="Re-deliver").click()
        expect(page.locator("#note")).to_contain_text(f"{running}: delivered to")
        expect(page.locator("#emitted-at time")).to_have_count(1)
        assert (app.settings.outbox_path / f"{running}.json").exists()

        page.goto(f"{url}/operator")
        page.locator("#ended-link").click()
        rows = page.locator("#ended tr[data-batch]")
        expect(rows).to_have_count(2)
        page.select_option('select[name="client"]', "beta")
        page.select_option('select[name="status"]', "emitted")
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(f"{url}/operator/batches?client=beta&status=emitted")
        expect(rows).to_have_count(1)
        link = page.locator(f'#ended tr[data-batch="{ended}"] a')
        expect(link).to_have_attribute("href", f"/operator/batches/{ended}?client=beta")
        link.click()
        expect(page.locator("#client")).to_have_text("beta")
        expect(page.locator("#status")).to_have_text("emitted")
        page.screenshot(path=str(Path("/tmp/operator-batch-page.png")), full_page=True)
        page.goto(f"{url}/operator/batches/{running}?client=beta")  # outside that scope
        expect(page.locator("#missing")).to_contain_text(f"no batch '{running}'")
    finally:
        server.stop()


def test_the_api_docs_render_with_the_network_blocked(app: App, page: object) -> None:
    from playwright.sync_api import Page, Route, expect

    assert isinstance(page, Page)
    expect.set_options(timeout=PATIENCE * 1000)
    blocked: list[str] = []

    def loopback_only(route: Route) -> None:
        host = urlsplit(route.request.url).hostname
        if host == "127.0.0.1":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", loopback_only)
    server = BackgroundServer(create_web(app.web, lambda: {}))
    url = server.start()
    try:
        page.goto(f"{url}/docs")
        operations = page.locator(".opblock-summary-path")
        expect(operations.first).to_be_visible()
        paths = set(operations.all_inner_texts())
        assert {"/api/eval/batches", "/api/eval/batches/{batch_id}/cancel"} <= {
            p.replace("\u200b", "") for p in paths
        }
        assert blocked == []  # Swagger UI asked nothing of another host
        page.goto(f"{url}/redoc")
        expect(page.get_by_text("/api/eval/batches/{batch_id}/report").first).to_be_attached()
        # ReDoc's menu footer shows its maker's logo from its CDN; offline it is left out
        assert set(blocked) <= {"https://cdn.redoc.ly/redoc/logo-mini.svg"}
    finally:
        server.stop()
