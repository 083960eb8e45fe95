"""The service as a real subprocess: watchdog observer, sandbox forge and lane, outbox."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkrun
import pytest
from conftest import PATIENCE, read_json, tasks, wait_for


def _cli(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> forkrun.Finished:
    return forkrun.run(["--home", str(home), *args], env, timeout)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env.update(extra)
    return env


def test_dropped_file_reaches_outbox_through_running_service(tmp_path: Path) -> None:
    env = _env(
        SAAS_EVAL_POLL_INTERVAL="0.3",
        SAAS_EVAL_QUIET_PERIOD="0.2",
        SAAS_EVAL_RESCAN_INTERVAL="600",
        SAAS_EVAL_SETTLE_SECONDS="1",
    )
    assert _cli(tmp_path, "clients", "add", "acme", "--credits", "10", env=env).returncode == 0
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dropbox_eval",
            "--home",
            str(tmp_path),
            "run",
            "--sandbox",
            "--lane-delay",
            "0.3",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: (tmp_path / "state" / "service.json").exists())
        time.sleep(0.5)  # the observer is running; the file below arrives as an event
        folder = tmp_path / "inbox" / "acme"
        folder.mkdir(parents=True)
        upload = folder / "run.json.filepart"
        upload.write_text(json.dumps({"batch_ref": "r1", "tasks": tasks(2)}))
        upload.rename(folder / "run.json")
        outbox = tmp_path / "outbox"
        assert wait_for(lambda: any(outbox.glob("*.json"))), service.stderr
        status = _cli(tmp_path, "status", "--json", env=env)
        assert json.loads(status.stdout)["running"] is True
        second = _cli(tmp_path, "run", "--sandbox", env=env)
        assert second.returncode == 5 and "another dropbox-eval run" in second.stderr
    finally:
        service.send_signal(signal.SIGTERM)
        _, stderr = service.communicate(timeout=PATIENCE)
    assert service.returncode == 0, stderr
    report = read_json(next((tmp_path / "outbox").glob("*.json")))
    assert report["batch_ref"] == "r1" and report["counts"]["passed"] == 2
    assert (tmp_path / "inbox" / "acme" / "accepted" / "run.json").exists()
    assert "accepted as batch" in stderr and "report emitted" in stderr
    batches = json.loads(_cli(tmp_path, "batches", "--json", env=env).stdout)
    assert [b["status"] for b in batches] == ["emitted"]


def test_run_without_forge_names_the_setting(tmp_path: Path) -> None:
    result = _cli(tmp_path, "run", "--once", env=_env())
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "SAAS_EVAL_GITEA_URL" in result.stderr and "--sandbox" in result.stderr


def test_invalid_setting_is_one_line(tmp_path: Path) -> None:
    result = _cli(tmp_path, "status", env=_env(SAAS_EVAL_POLL_INTERVAL="soon"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "SAAS_EVAL_POLL_INTERVAL" in result.stderr


@pytest.mark.parametrize("lane", [[], ["--lane", "labels"]], ids=["pulls", "labels"])
def test_demo_runs_in_an_empty_folder(tmp_path: Path, lane: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dropbox_eval", "demo", "--lane-delay", "0.2", *lane],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr
    reports = list((tmp_path / "outbox").glob("*.json"))
    assert len(reports) == 1
    report = read_json(reports[0])
    assert report["counts"] == {"total": 3, "passed": 2, "failed": 1}
    assert str(reports[0].name) in result.stdout
    pulls = {r["task_id"]: r["pull_request"] for r in report["results"]}
    if lane:  # labels: no pull requests
        assert pulls == {"t1": None, "t2": None, "t3": None}
    else:  # pulls (the default): merged with a merge sha, and the lane:fail one abandoned
        assert pulls["t1"]["merged"] is True and len(pulls["t1"]["merge_commit_sha"]) == 40
        assert pulls["t2"]["merged"] is False and pulls["t2"]["merge_commit_sha"] is None
