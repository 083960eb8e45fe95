"""Forge quirks a hostile world hits: duplicate label names, owner spelling, proxies' Date
headers. Real sandbox or loopback HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from conftest import tasks

from dropbox_eval.app import build_app, service_for
from dropbox_eval.config import Settings
from dropbox_eval.errors import ForgeNotFound
from dropbox_eval.forge.client import GiteaClient
from dropbox_eval.sandbox import SandboxForge

LABEL = "eval-task"


@pytest.fixture
def client(forge: SandboxForge, tmp_path: Path) -> GiteaClient:
    return GiteaClient(forge.url, forge.token, label_lock=tmp_path / "labels.lock")


def _api(forge: SandboxForge, method: str, path: str, **kwargs: Any) -> Any:
    response = requests.request(
        method,
        f"{forge.url}/api/v1{path}",
        timeout=30,
        headers={"Authorization": f"token {forge.token}"},
        **kwargs,
    )
    response.raise_for_status()
    return response.json() if response.content else None


def _labels(forge: SandboxForge, repo: str, name: str = LABEL) -> list[int]:
    return sorted(
        lab["id"] for lab in _api(forge, "GET", f"/repos/{repo}/labels") if lab["name"] == name
    )


def _duplicate(forge: SandboxForge, repo: str) -> int:
    """What a racing creator without our lock does: a second label with the same name."""
    return int(
        _api(forge, "POST", f"/repos/{repo}/labels", json={"name": LABEL, "color": "#ff0000"})["id"]
    )


# -- duplicate label names ----------------------------------------------------------------


def test_duplicate_labels_are_merged_into_the_oldest(
    client: GiteaClient, forge: SandboxForge
) -> None:
    repo = f"{forge.user}/dups"
    client.ensure_repo(repo)
    oldest = client.ensure_label(repo, LABEL, "5319e7")
    first = client.create_issue(repo, "one", "b", [oldest]).number
    newer = _duplicate(forge, repo)
    second = client.create_issue(repo, "two", "b", [newer]).number
    assert list(client.iter_issues(repo, labels=LABEL, state="open")) != []  # heals itself
    assert client.ensure_label(repo, LABEL, "5319e7") == oldest
    assert _labels(forge, repo) == [oldest]
    numbers = sorted(i.number for i in client.iter_issues(repo, labels=LABEL))
    assert numbers == [first, second]


def test_polling_finds_issues_after_a_duplicate_appears(
    client: GiteaClient, forge: SandboxForge
) -> None:
    repo = f"{forge.user}/poll-dups"
    client.ensure_repo(repo)
    label = client.ensure_label(repo, LABEL, "5319e7")
    created = [client.create_issue(repo, f"t{i}", "b", [label]).number for i in range(3)]
    for number in created[:2]:
        client.close_issue(repo, number)
    _duplicate(forge, repo)  # Gitea now ANDs both ids: the name filter matches nothing
    assert client.count_issues(repo, state="open", labels=LABEL) == 1
    assert _labels(forge, repo) == [label]
    _duplicate(forge, repo)
    closed = sorted(i.number for i in client.iter_issues(repo, state="closed", labels=LABEL))
    assert closed == sorted(created[:2])
    assert _labels(forge, repo) == [label]


def test_resumed_intake_adopts_despite_a_duplicate_label(
    settings: Settings, forge: SandboxForge
) -> None:
    app = build_app(settings)
    app.billing.add_client("acme", 100)
    forge.fail_next(1, 502, path_contains="/issues")
    batch_id = app.intake.submit_batch("acme", tasks(6))["batch_id"]
    repo = f"{forge.user}/eval-acme-{batch_id}"
    before = len(forge.issues(forge.user, f"eval-acme-{batch_id}"))
    assert 0 < before < 6
    _duplicate(forge, repo)
    app.intake.open_issues(batch_id)
    issues = forge.issues(forge.user, f"eval-acme-{batch_id}")
    assert len(issues) == 6, "a resumed intake must adopt, not duplicate, existing issues"
    assert len(_labels(forge, repo)) == 1


@pytest.mark.parametrize("shared_lock", [True, False])
def test_racing_creators_end_with_one_label(
    forge: SandboxForge, tmp_path: Path, shared_lock: bool
) -> None:
    """Two creators (service and CLI) race; with the shared lock they are serialised, and
    without it (another machine) both still converge on the oldest label."""
    repo = f"{forge.user}/race"
    GiteaClient(forge.url, forge.token).ensure_repo(repo)
    clients = [
        GiteaClient(
            forge.url,
            forge.token,
            label_lock=tmp_path / ("labels.lock" if shared_lock else f"labels-{i}.lock"),
        )
        for i in range(2)
    ]
    results: list[int] = []
    barrier = threading.Barrier(2)

    def create(gitea: GiteaClient) -> None:
        barrier.wait()
        results.append(gitea.ensure_label(repo, LABEL, "5319e7"))

    forge.set_delay(0.1)  # widens the list-then-create window; correctness never needs it
    threads = [threading.Thread(target=create, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    forge.set_delay(0)
    assert len(results) == 2 and results[0] == results[1]
    assert _labels(forge, repo) == [results[0]]


def test_unknown_label_name_never_lists_every_issue(
    client: GiteaClient, forge: SandboxForge
) -> None:
    """Gitea drops a filter whose names all miss; the client must not pass that on."""
    repo = f"{forge.user}/unknown-label"
    client.ensure_repo(repo)
    client.create_issue(repo, "someone else's issue", "b", [])
    assert list(client.iter_issues(repo, labels=LABEL)) == []


def test_sandbox_deletes_labels_like_gitea(client: GiteaClient, forge: SandboxForge) -> None:
    repo = f"{forge.user}/delete-label"
    client.ensure_repo(repo)
    label = client.ensure_label(repo, "bug", "ee0701")
    number = client.create_issue(repo, "x", "b", [label]).number
    requests.delete(
        f"{forge.url}/api/v1/repos/{repo}/labels/{label}",
        timeout=30,
        headers={"Authorization": f"token {forge.token}"},
    ).raise_for_status()
    assert client.get_issue(repo, number).labels == []
    gone = requests.delete(
        f"{forge.url}/api/v1/repos/{repo}/labels/{label}",
        timeout=30,
        headers={"Authorization": f"token {forge.token}"},
    )
    assert gone.status_code == 404


# -- logins are case-insensitive ------------------------------------------------------------


def test_owner_spelled_differently_from_login(client: GiteaClient, forge: SandboxForge) -> None:
    url = client.ensure_repo(f"{forge.user.upper()}/cased")
    assert url.endswith(f"/{forge.user}/cased")  # the forge's own spelling
    assert client.ensure_repo(f"{forge.user.title()}/cased") == url
    assert client.ensure_repo("EvalOrg/shared-cased").endswith("/evalorg/shared-cased")
    with pytest.raises(ForgeNotFound):
        client.ensure_repo("no-such-org/x")


def test_service_with_upper_case_owner_opens_issues(
    settings: Settings, forge: SandboxForge
) -> None:
    app = build_app(settings.model_copy(update={"owner": forge.user.upper()}))
    app.billing.add_client("acme", 100)
    batch_id = app.intake.submit_batch("acme", tasks(2))["batch_id"]
    assert len(forge.issues(forge.user, f"eval-acme-{batch_id}")) == 2
    assert app.intake.open_issues(batch_id) == 0


# -- Date headers a proxy mangled; `since` always carries an offset ---------------------------


@pytest.fixture
def odd_forge() -> Iterator[tuple[str, list[str], list[str], list[dict[str, Any]]]]:
    """A loopback 'forge' answering issue lists (`items`) with the Date headers in `dates`
    and 422 (like Gitea's RFC 3339 parser) to a `since` without an offset. Records every
    `since`."""
    dates: list[str] = []
    sent: list[str] = []
    items: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            since = parse_qs(urlsplit(self.path).query).get("since", [None])[0]
            if since is not None:
                sent.append(since)
            ok = since is None or since.endswith("Z") or since[-6] in "+-"
            body = json.dumps(items if ok else {"message": "parsing time"}).encode()
            self.send_response_only(200 if ok else 422)
            for value in dates:
                self.send_header("Date", value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", dates, sent, items
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (["Tue, 01 Dec 2026 03:00:00 GMT"], datetime(2026, 12, 1, 3, tzinfo=UTC)),
        (["Tue, 01 Dec 2026 05:00:00 +0200"], datetime(2026, 12, 1, 3, tzinfo=UTC)),
        (["Tue, 01 Dec 2026 03:00:00 GMT", "Tue, 01 Dec 2026 03:00:00 GMT"], None),  # duplicated
        (["Tue, 01 Dec 2026 03:00:00 -0000"], None),  # "zone unknown": naive in email.utils
        (["yesterday"], None),
        ([], None),
    ],
)
def test_date_header_gives_aware_utc_or_none_and_since_keeps_an_offset(
    odd_forge: tuple[str, list[str], list[str], list[dict[str, Any]]],
    headers: list[str],
    expected: datetime | None,
) -> None:
    url, dates, sent, _ = odd_forge
    dates.extend(headers)
    client = GiteaClient(url, "t")
    assert list(client.iter_issues("o/r")) == []
    assert client.listed_at == expected
    assert client.listed_at is None or client.listed_at.tzinfo is not None
    since = client.listed_at or datetime(2026, 12, 1, 3)  # naive: taken as UTC
    assert list(client.iter_issues("o/r", since=since)) == []
    assert sent == ["2026-12-01T03:00:00Z"]


def test_issue_timestamps_without_offset_are_read_as_utc(
    odd_forge: tuple[str, list[str], list[str], list[dict[str, Any]]],
) -> None:
    url, _, _, items = odd_forge
    items.append(
        {
            "number": 1,
            "title": "t",
            "state": "closed",
            "labels": [],
            "html_url": "http://x/1",
            "updated_at": "2026-12-01T03:00:00",
            "closed_at": "2026-12-01T05:00:00+02:00",
        }
    )
    issue = next(GiteaClient(url, "t").iter_issues("o/r"))
    assert issue.updated_at == issue.closed_at == datetime(2026, 12, 1, 3, tzinfo=UTC)
    assert issue.updated_at.tzinfo is UTC and issue.closed_at is not None
    assert issue.closed_at.tzinfo is UTC


def test_naive_since_is_sent_as_utc_to_the_sandbox(
    client: GiteaClient, forge: SandboxForge
) -> None:
    repo = f"{forge.user}/naive-since"
    client.ensure_repo(repo)
    client.create_issue(repo, "one", "b", [])
    assert len(list(client.iter_issues(repo, since=datetime(2000, 1, 1)))) == 1
    assert list(client.iter_issues(repo, since=datetime(2999, 1, 1))) == []


def test_full_poll_repairs_a_duplicate_and_finishes_tasks(
    settings: Settings, forge: SandboxForge
) -> None:
    shared = {"full_poll_every": 2, "repo": f"{forge.user}/shared-labels"}  # a shared repo's label
    app = build_app(settings.model_copy(update=shared))
    app.billing.add_client("acme", 100)
    batch_id = app.intake.submit_batch("acme", tasks(2))["batch_id"]
    repo = app.store.get_batch(batch_id).repo
    service = service_for(app)
    service.poll_cycle()  # cycle 1: full
    _duplicate(forge, repo)
    first = app.store.get_tasks(batch_id)[0]
    forge.finish_issue(
        *repo.split("/"), first.issue_number or 0, comment="ok", labels=["eval-pass"]
    )
    service.poll_cycle()  # cycle 2: incremental, blind while the name matches two labels
    service.poll_cycle()  # cycle 3: full, the probe repairs the labels
    assert len(_labels(forge, repo)) == 1
    assert app.store.get_tasks(batch_id)[0].status == "passed"
    forge.clear_requests()
    second = app.store.get_tasks(batch_id)[1]
    forge.finish_issue(
        *repo.split("/"), second.issue_number or 0, comment="ok", labels=["eval-pass"]
    )
    service.poll_cycle()  # incremental again, and it sees the close
    assert app.store.get_tasks(batch_id)[1].status == "passed"
