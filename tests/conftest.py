"""Shared fixtures: a real sandbox forge on loopback, a real callback receiver, tmp state."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema_rs
import pytest
import requests
from click.testing import CliRunner, Result
from fastapi import FastAPI

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.cli import main
from dropbox_eval.config import Settings, load_settings
from dropbox_eval.delivery.webhook import WebhookEmitter
from dropbox_eval.models import TaskRecord, TaskSpec, utcnow
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.schemas import NAMES, shipped
from dropbox_eval.service import Service
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.rows import dump
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web

if TYPE_CHECKING:
    from pgcluster import Cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A private PostgreSQL cluster for the session (pgcluster.py), started only when a
    test asks for it; each test takes a fresh schema of it (`fresh_url`)."""
    from pgcluster import running

    with running() as cluster:
        yield cluster


@pytest.fixture
def forge() -> Iterator[SandboxForge]:
    """A sandbox forge with no lane: tests close issues themselves."""
    with SandboxForge(port=0) as running:
        yield running


def settings_on(forge: SandboxForge, home: Path, **fields: Any) -> Settings:
    """Settings rooted in `home`, pointing at `forge` (its URL, token and user), plus `fields`."""
    return load_settings(
        home=home, gitea_url=forge.url, gitea_token=forge.token, owner=forge.user, **fields
    )


ENGINES = ("tinydb", "postgres")
# DROPBOX_EVAL_TEST_ENGINE=postgres: every test using `settings` on PostgreSQL (minutes
# more than CI's time allows for the whole suite; CI runs the `both_engines` modules)
DEFAULT_ENGINE = os.environ.get("DROPBOX_EVAL_TEST_ENGINE", "tinydb")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked `both_engines` runs each test using `settings` on TinyDB and on
    PostgreSQL (the session's private cluster, a fresh schema per test)."""
    if metafunc.definition.get_closest_marker("both_engines") and "engine" in metafunc.fixturenames:
        metafunc.parametrize("engine", ENGINES, indirect=True)


_database_url: list[str] = []
"""The PostgreSQL URL of the running test's store (`engine`), if any: `database_env`."""


def database_env() -> dict[str, str]:
    """SAAS_EVAL_DATABASE_URL of the running test's store when it is PostgreSQL, else
    nothing: what a CLI (in-process or a child process) needs besides the home folder to
    find that store."""
    return {"SAAS_EVAL_DATABASE_URL": _database_url[0]} if _database_url else {}


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The store the test's settings name: None (TinyDB, unless the module is marked
    `both_engines` or DROPBOX_EVAL_TEST_ENGINE says postgres) or a PostgreSQL URL. A test
    marked `tinydb_files` is about the TinyDB engine's own files: always TinyDB."""
    chosen = getattr(request, "param", DEFAULT_ENGINE)
    if chosen == "tinydb" or request.node.get_closest_marker("tinydb_files"):
        yield None
        return
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    url = cluster.fresh_url()
    _database_url[:] = [url]
    try:
        yield url
    finally:
        _database_url.clear()
        _close_pools()


def _close_pools() -> None:
    """Close every connection pool the test left open (the stores its app, service and
    commands built): the session's cluster would run out of connections otherwise."""
    from psycopg_pool import ConnectionPool

    for pool in [obj for obj in gc.get_objects() if isinstance(obj, ConnectionPool)]:
        if not pool.closed:
            pool.close()


@pytest.fixture
def settings(tmp_path: Path, forge: SandboxForge, engine: str | None) -> Settings:
    """Settings rooted in a tmp folder, pointing at the sandbox forge (and the engine's
    database, for a module marked `both_engines`)."""
    return settings_on(
        forge,
        tmp_path,
        database_url=engine,
        quiet_period=0.1,
        poll_interval=0.2,
        settle_seconds=0,  # tests close issues in one go; test_lane_results.py settles
        task_price=2,
        retry_base=0.2,
        retry_cap=2.0,
        callback_allow="127.0.0.1",
    )


@pytest.fixture
def app(settings: Settings) -> App:
    """Wired components (callbacks time out after 30 s)."""
    built = build_app(settings)
    built.delivery.emitter.webhooks = WebhookEmitter(timeout=30)
    return built


OPERATOR_KEY = "operator-secret-key"


@pytest.fixture
def operator_web(app: App) -> Iterator[tuple[str, FastAPI]]:
    """The web app over `app` with the operator key OPERATOR_KEY, on a loopback port, and the
    app itself (its `state` holds the page's sessions and sign-in throttle)."""
    app.settings.operator_key = OPERATOR_KEY
    api = create_web(app.web, lambda: {})
    server = BackgroundServer(api)
    yield server.start(), api
    server.stop()


@pytest.fixture
def funded(app: App) -> str:
    """A client with 100 credits."""
    app.billing.add_client("acme", 100)
    return "acme"


def tasks(count: int, prefix: str = "t") -> list[dict[str, Any]]:
    """A list of simple task specs."""
    return [
        {
            "task_id": f"{prefix}{i}",
            "title": f"Task {i}",
            "body": f"Do thing {i}.",
            "acceptance": [f"thing {i} done"],
        }
        for i in range(1, count + 1)
    ]


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A client folder (`acme`) and a descriptor open on it, as the SFTP endpoint holds
    one for each session (closed after)."""
    path = tmp_path / "acme"
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield path, fd
    finally:
        os.close(fd)


def stored_tasks(state: Path, batch_id: str, count: int) -> TinyDBStore:
    """A TinyDB store in `state` holding `count` tasks of `batch_id` (its tasks file only,
    as intake writes it)."""
    store = TinyDBStore(state)
    now = utcnow()
    records = [
        TaskRecord(
            task_id=spec["task_id"],
            batch_id=batch_id,
            repo="o/r",
            payload=TaskSpec.model_validate(spec),
            created_at=now,
        )
        for spec in tasks(count)
    ]
    store.tasks.create(batch_id, [dump(t) for t in records])
    return store


@dataclass
class Receiver:
    """A loopback HTTP server recording POSTs and answering scripted statuses."""

    url: str
    answers: list[int]
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


def start_receiver(port: int = 0) -> tuple[Receiver, ThreadingHTTPServer]:
    """A real callback receiver on 127.0.0.1 (port 0 = any free port)."""
    state = Receiver(url="", answers=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            status = state.answers.pop(0) if state.answers else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    return state, server


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real callback receiver on 127.0.0.1."""
    state, server = start_receiver()
    yield state
    server.shutdown()
    server.server_close()


PATIENCE = 60.0
"""Seconds a test waits for something that should happen (a subprocess, an SFTP session, a
forge round trip...). Generous so that a loaded machine is slow, not wrong; a wait returns
as soon as its condition holds, so the limit costs nothing when things work. A test never
asserts an upper bound on wall-clock time: it asserts what happened, and in which order."""


def wait_for(predicate: Callable[[], bool], timeout: float = PATIENCE) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass; its last answer.

    Leave `timeout` out when waiting for something to happen; pass a short one only to
    check that something does *not* happen (`assert not wait_for(..., 1.0)`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def readiness(url: str) -> tuple[int, dict[str, Any]]:
    """`/readyz` of the server at `url`: its status code and document."""
    answer = requests.get(f"{url}/readyz", timeout=PATIENCE)
    return answer.status_code, answer.json()


def metric(url: str, series: str) -> float | None:
    """The value of the `/metrics` sample whose name and labels are `series`, or None."""
    for sample in requests.get(f"{url}/metrics", timeout=PATIENCE).text.splitlines():
        if sample.startswith(f"{series} "):
            return float(sample.split()[-1])
    return None


def read_json(path: Path) -> Any:
    """Parse a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))


class Cli:
    """`dropbox-eval` in-process, rooted in a tmp home, the token in the environment."""

    def __init__(self, home: Path, forge: SandboxForge) -> None:
        self.home = home
        self.forge = forge
        self.runner = CliRunner()
        self.base = ["--home", str(home), "--gitea-url", forge.url, "--owner", forge.user]

    def __call__(self, *args: str, base: bool = True, env: dict[str, str] | None = None) -> Result:
        return self.runner.invoke(
            main, [*(self.base if base else []), *args], env={**database_env(), **(env or {})}
        )

    def submit(self, count: int, client: str = "acme") -> str:
        """Submit a batch of `count` tasks for `client`; its batch id."""
        source = self.home / f"b{count}-{client}.json"
        source.write_text(json.dumps({"client_id": client, "tasks": tasks(count)}))
        result = self("submit", str(source), "--json")
        assert result.exit_code == 0, result.output
        return str(json.loads(result.stdout)["batch_id"])


def isolated_cli(home: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """A `Cli` whose environment holds no setting of the machine's, only the token."""
    for key in list(os.environ):
        if key.startswith(("SAAS_EVAL_", "SANDBOX_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SAAS_EVAL_GITEA_TOKEN", forge.token)
    return Cli(home, forge)


@contextlib.contextmanager
def serving(app: App) -> Iterator[Service]:
    """A service over `app`'s state run (`dropbox-eval run`) in a thread for as long as
    the block runs: watcher, opener, poller, delivery."""
    with running(service_for(app)) as service:
        yield service


@contextlib.contextmanager
def running(service: Service) -> Iterator[Service]:
    """`service` run in a thread for as long as the block runs."""
    thread = threading.Thread(target=service.run, name="service-under-test", daemon=True)
    thread.start()
    assert wait_for(lambda: service.status.get("state") == "running", 60)
    try:
        yield service
    finally:
        service.stop()
        thread.join(timeout=120)
    assert not thread.is_alive()


@contextlib.contextmanager
def served(app: App) -> Iterator[str]:
    """The HTTP server (API, metrics, health, page) over `app` on a loopback port, as
    `serve` runs it, for as long as the block runs; its base URL."""
    server = BackgroundServer(create_web(app.web, lambda: {}))
    try:
        yield server.start()
    finally:
        server.stop()


SCHEMAS = {
    name: jsonschema_rs.Draft202012Validator(json.loads(shipped(name)), validate_formats=True)
    for name in NAMES
}
"""A validator of each published schema (dropbox_eval/schemas/*.json)."""


def document_kind(path: Path) -> str | None:
    """Which published document a file is, by where the service writes it: a receipt in
    `accepted/`, an error file in `rejected/`, a report in `outbox/` or
    `outbox/undelivered/`; None for any other file."""
    folder, name = path.parent, path.name
    if folder.name == "accepted" and name.endswith(".receipt.json"):
        return "receipt"
    if folder.name == "rejected" and name.endswith(".error.json"):
        return "error"
    undelivered = folder.name == "undelivered" and folder.parent.name == "outbox"
    in_outbox = folder.name == "outbox" or undelivered
    if in_outbox and name.endswith(".json") and not name.startswith("."):
        return "report"
    return None


def schema_problems(root: Path) -> list[str]:
    """Every receipt, error file and report under `root` (links never followed) that its
    published schema refuses, one line each."""
    problems: list[str] = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            kind = document_kind(path)
            if kind is None or path.is_symlink():
                continue
            try:
                document = json.loads(path.read_bytes())
            except (OSError, ValueError) as exc:
                problems.append(f"{path}: not a readable JSON {kind}: {exc}")
                continue
            problems += [
                f"{path}: the {kind} schema refuses {error.instance_path or '/'}: "
                + error.message[:500]
                for error in SCHEMAS[kind].iter_errors(document)
            ]
    return problems


@pytest.fixture(autouse=True)
def published_documents_match_their_schemas(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[None]:
    """After every test: each receipt, error file and report the test made under its
    `tmp_path` validates against the schema clients get (`dropbox-eval schema`). A test
    that writes look-alike documents itself is marked `planted_documents`."""
    yield
    if request.node.get_closest_marker("planted_documents") is None:
        problems = schema_problems(tmp_path)
        assert not problems, "documents that break their published schema:\n" + "\n".join(problems)
