"""Boundaries a hostile client probes (issue 32): `X-Forwarded-For` believed only from a
trusted proxy; bidirectional controls refused in any client text as in file names; every
file under state/ 0600 and every folder 0700, repaired at the service's start; and the API
documents: every route with its auth, real response schemas, text that survives `<...>`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import OPERATOR_KEY, Cli, isolated_cli, tasks

from dropbox_eval.app import App, build_service
from dropbox_eval.config import load_settings
from dropbox_eval.errors import BatchRejected
from dropbox_eval.protocol.batchfile import parse_batch
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web

BIDI = ["\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u200f", "\u061c"]


@contextlib.contextmanager
def web_on(app: App, proxies: str) -> Iterator[str]:
    """The web app over `app` on a loopback port, trusting `proxies`."""
    app.settings.operator_key = OPERATOR_KEY
    app.settings.trusted_proxies = proxies
    server = BackgroundServer(create_web(app.web, lambda: {}))
    try:
        yield server.start()
    finally:
        server.stop()


def wrong_keys_until_closed(url: str, forwarded_for: str) -> int:
    """Wrong sign-ins from the test's loopback address, each claiming `forwarded_for`,
    until one is answered 429; how many it took."""
    for tries in range(1, 10):
        answer = requests.post(
            f"{url}/operator/login",
            data={"key": "wrong"},
            headers={"X-Forwarded-For": forwarded_for},
            timeout=30,
        )
        if answer.status_code == 429:
            return tries
    return 0


@pytest.mark.parametrize("proxies", ["", "10.9.9.9"])
def test_a_forwarded_for_header_from_an_untrusted_peer_opens_no_fresh_bucket(
    app: App, proxies: str
) -> None:
    with web_on(app, proxies) as url:
        closed_after = wrong_keys_until_closed(url, "203.0.113.1")
        assert closed_after == 5  # 3 free, the 4th closes the door for 1 s: the 5th waits
        assert wrong_keys_until_closed(url, "203.0.113.2") == 1  # the same bucket: closed


def test_a_trusted_proxy_names_the_client(app: App) -> None:
    with web_on(app, "127.0.0.0/8") as url:
        assert wrong_keys_until_closed(url, "203.0.113.1") == 5
        assert wrong_keys_until_closed(url, "203.0.113.2") == 5  # another client behind it


def test_an_untrusted_proxy_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAAS_EVAL_TRUSTED_PROXIES", "10.0.0.0/8, proxy.example")
    with pytest.raises(Exception, match="TRUSTED_PROXIES.*'proxy.example' is not an IP"):
        load_settings()


@pytest.mark.parametrize("character", BIDI)
@pytest.mark.parametrize("where", ["title", "body", "acceptance"])
def test_bidi_controls_are_refused_in_client_text(character: str, where: str) -> None:
    task: dict[str, Any] = {"task_id": "t1", "title": "a title"}
    task[where] = [f"x{character}y"] if where == "acceptance" else f"x{character}y"
    raw = json.dumps({"client_id": "acme", "tasks": [task]}).encode()
    with pytest.raises(BatchRejected) as refused:
        parse_batch(raw, max_bytes=1 << 20, max_tasks=10)
    assert refused.value.details["field"].startswith(f"tasks.0.{where}")
    assert f"U+{ord(character):04X}" in refused.value.message
    assert "bidirectional control" in refused.value.message


def test_bidi_controls_are_refused_in_metadata_values() -> None:
    raw = json.dumps({"client_id": "a", "tasks": tasks(1), "metadata": {"run": "x\u202ey"}})
    with pytest.raises(BatchRejected) as refused:
        parse_batch(raw.encode(), max_bytes=1 << 20, max_tasks=10)
    assert refused.value.details["field"] == "metadata.run"
    assert "U+202E" in refused.value.message


def modes(root: Path) -> dict[str, list[str]]:
    """Everything under `root` that is not private: folders not 0700, files not 0600."""
    loose: dict[str, list[str]] = {"folders": [], "files": []}
    for folder, folders, files in os.walk(root):
        for name in folders:
            if stat.S_IMODE(os.lstat(Path(folder) / name).st_mode) & 0o077:
                loose["folders"].append(name)
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink() and stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
                loose["files"].append(str(path.relative_to(root)))
    return loose


@pytest.mark.tinydb_files
def test_every_state_file_is_0600_and_every_folder_0700_and_a_start_repairs_them(
    app: App, funded: str, caplog: pytest.LogCaptureFixture
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    app.lifecycle.cancel(batch_id)
    app.delivery.emit(batch_id)  # ended and archived: the archive's ledgers and folders
    state = app.settings.state_path
    assert modes(state) == {"folders": [], "files": []}
    loosened = []
    for folder, folders, files in os.walk(state):  # as an older version left them
        for name in folders:
            (Path(folder) / name).chmod(0o755)
            loosened.append(name)
        for name in files:
            (Path(folder) / name).chmod(0o644)
    assert loosened and modes(state)["files"]
    with caplog.at_level(logging.WARNING, logger="dropbox_eval"):
        build_service(app.settings)  # the service's start
    assert modes(state) == {"folders": [], "files": []}
    assert len([m for m in caplog.messages if "made private" in m]) == 1


def test_docs_list_every_route_with_its_auth_and_real_answers(app: App) -> None:
    with web_on(app, "") as url:
        document = requests.get(f"{url}/openapi.json", timeout=30).json()
        redoc = requests.get(f"{url}/redoc", timeout=30)
    paths = document["paths"]
    for route, method in [("/api/eval/pause", "get"), ("/api/eval/pause", "post")] + [
        ("/api/eval/resume", "post")
    ]:
        operation = paths[route][method]
        assert operation["security"] == [{"operatorKey": []}], route
        assert "200" in operation["responses"] and "401" in operation["responses"]
    schemes = document["components"]["securitySchemes"]
    assert schemes["operatorKey"]["scheme"] == "bearer"
    for route in ("/api/eval/batches", "/api/eval/batches/{batch_id}/retry"):
        created = paths[route]["post"]["responses"]["201"]["content"]["application/json"]
        schema = created["schema"]
        assert "$ref" in schema, schema  # a model, not a bare object
        name = schema["$ref"].rsplit("/", 1)[1]
        assert "batch_id" in document["components"]["schemas"][name]["properties"]
    text = json.dumps(document)
    assert "inbox/<client_id>/" not in text.replace("`inbox/<client_id>/`", "")
    assert "inbox/&lt;client_id&gt;/" in text
    assert redoc.status_code == 200


def test_the_cli_reads_the_units_environment_file(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli: Cli = isolated_cli(tmp_path, forge, monkeypatch)
    env = tmp_path / "dropbox-eval.env"
    env.write_text(
        f"# as deploy/dropbox-eval.env\nSAAS_EVAL_HOME={tmp_path / 'srv'}\n"
        f"SAAS_EVAL_GITEA_URL={forge.url}\nSAAS_EVAL_OWNER={forge.user}\n"
        "SAAS_EVAL_CALLBACK_ALLOW=$NOT_EXPANDED\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("SAAS_EVAL_HOME", str(tmp_path / "elsewhere"))  # the shell's: unread
    added = cli("--env-file", str(env), "clients", "add", "acme", base=False)
    assert added.exit_code == 0, added.output
    assert (tmp_path / "srv" / "state").is_dir() and not (tmp_path / "elsewhere").exists()
    monkeypatch.setenv("SAAS_EVAL_ENV_FILE", str(env))
    settings = load_settings(env)
    assert settings.callback_allow == "$NOT_EXPANDED"  # as systemd reads it
    listed = cli("clients", "list", "--json", base=False)
    assert listed.exit_code == 0 and "acme" in listed.stdout
    missing = cli("--env-file", str(tmp_path / "nope.env"), "status", base=False)
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_status_names_the_settings_that_differ_from_the_running_service(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    from filelock import FileLock

    from dropbox_eval.ops.sameconfig import published
    from dropbox_eval.workers.status import StatusFile

    cli: Cli = isolated_cli(tmp_path, forge, monkeypatch)
    cli("clients", "add", "acme")
    service = load_settings(
        home=tmp_path, gitea_url=forge.url, owner=forge.user, callback_allow="127.0.0.1"
    )
    StatusFile(tmp_path / "state" / "service.json").set(settings=published(service))
    with FileLock(str(tmp_path / "state" / "service.lock")):
        shown = cli("status")
        same = cli("status", "--json", env={"SAAS_EVAL_CALLBACK_ALLOW": "127.0.0.1"})
    assert "callback policy: SAAS_EVAL_CALLBACK_ALLOW is unset here, '127.0.0.1'" in shown.output
    assert "--env-file" in shown.output
    assert "forge:" not in shown.output and "folders:" not in shown.output
    assert json.loads(same.stdout)["settings_differ"] == []
