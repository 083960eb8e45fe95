"""A full, read-only or refused disk is a named state: `/readyz` says which folder and why,
the API answers 507 `storage_full`, `/metrics` keeps answering, the log does not flood, and
everything resumes by itself when space returns. The command line says so in one line.

Real parts: a `dropbox-eval run --http-port 0` child whose home is a 4 MiB tmpfs mounted
here (CI runs as root), filled to ENOSPC with a filler file, then remounted read-only.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import PATIENCE, read_json, tasks, wait_for
from test_pause import Running
from test_retry import Home

from dropbox_eval.api import os_error_response
from dropbox_eval.errors import EXIT_FAILED, EXIT_USAGE, storage_error
from dropbox_eval.logfilter import AUDIT, RepeatFilter
from dropbox_eval.sandbox import SandboxForge

MAX_TRACEBACKS = 10


class QuickHome(Home):
    """A home whose service rescans its inbox every second: a drop that met the full disk
    is taken again at the next rescan (30 s by default)."""

    def env(self) -> dict[str, str]:
        return super().env() | {"SAAS_EVAL_RESCAN_INTERVAL": "1"}


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own, unmounted at the end whatever happened."""
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(filler: Path) -> None:
    """Write to `filler` until the file system has no block left (again: what the service
    freed since counts too)."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def post(url: str, key: str, ref: str) -> requests.Response:
    return requests.post(
        f"{url}/api/eval/batches",
        json={"batch_ref": ref, "tasks": tasks(1)},
        headers={"Authorization": f"Bearer {key}"},
        timeout=PATIENCE,
    )


def readiness(url: str) -> tuple[int, dict[str, Any]]:
    answer = requests.get(f"{url}/readyz", timeout=PATIENCE)
    return answer.status_code, answer.json()


def one_error_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """The command said one `error:` line naming `words`, and no traceback."""
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert all(word in lines[0] for word in words), lines[0]


@pytest.mark.slow
def test_a_full_disk_is_named_answered_quiet_and_resumes_by_itself(
    tmpfs: Path, forge: SandboxForge
) -> None:
    home = QuickHome(tmpfs, forge)
    assert home.run("clients", "add", "acme", "--credits", "100").returncode == 0
    key = home.json("clients", "api-key", "acme")["api_key"]
    service = Running(home)
    try:
        first = post(service.url, key, "before")
        assert first.status_code == 201, first.text
        waiting = tmpfs / "inbox" / "acme" / ".late.json.tmp"
        waiting.parent.mkdir(parents=True, exist_ok=True)
        waiting.write_text(json.dumps({"batch_ref": "late", "tasks": tasks(1)}), "utf-8")
        filler = tmpfs / "filler"
        fill(filler)
        waiting.rename(waiting.parent / "late.json")  # a drop arriving on a full disk

        def full_and_named() -> bool:
            fill(filler)
            code, body = readiness(service.url)
            return code == 503 and "state folder" in body["checks"]["storage"]

        assert wait_for(full_and_named), readiness(service.url)
        storage = readiness(service.url)[1]["checks"]["storage"]
        assert f"state folder {tmpfs / 'state'}: no space left on device (ENOSPC)" in storage
        for n in range(3):
            refused = post(service.url, key, f"full-{n}")
            assert refused.status_code == 507, refused.text
            assert refused.json()["reason"] == "storage_full"
            assert "no space left on device (ENOSPC)" in refused.json()["message"]
            assert str(tmpfs) not in refused.text  # the paths are the operator's
            assert refused.headers["Retry-After"] == "60"
        scrape = requests.get(f"{service.url}/metrics", timeout=PATIENCE)
        assert scrape.status_code == 200
        assert 'dropbox_eval_storage_writable{folder="state"} 0.0' in scrape.text

        fund = home.run("clients", "fund", "acme", "5")
        assert fund.returncode == EXIT_FAILED
        one_error_line(fund, str(tmpfs / "state"), "no space left on device (ENOSPC)")
        status = home.run("status", "--json")
        assert status.returncode == EXIT_FAILED and "Traceback" not in status.stderr
        assert json.loads(status.stdout)["reason"] == "storage_full"

        receipt = tmpfs / "inbox" / "acme" / "accepted" / "late.json.receipt.json"
        assert not wait_for(receipt.exists, 3.0)  # passes keep failing the same way
        tracebacks = sum("Traceback" in line for line in service.lines)
        assert tracebacks <= MAX_TRACEBACKS, "".join(service.lines[-60:])

        filler.unlink()  # space returns: nothing to restart, nothing to repair
        assert wait_for(lambda: readiness(service.url)[0] == 200), readiness(service.url)
        assert wait_for(receipt.exists)
        after = post(service.url, key, "after")
        assert after.status_code == 201, after.text
        late = read_json(receipt)["batch_id"]
        assert wait_for(lambda: home.json("batch", late)["intake_done"])
        refs = sorted(row["batch_ref"] for row in home.json("batches"))
        assert refs == ["after", "before", "late"]  # the refused posts left nothing
        client = home.json("clients", "show", "acme")
        assert client["held"] == 3 and client["balance"] == 100  # one hold per batch
    finally:
        if service.process.poll() is None:
            service.stop()
    assert sum("Traceback" in line for line in service.lines) <= MAX_TRACEBACKS


def test_commands_on_a_read_only_or_missing_state_folder_say_one_line(
    tmpfs: Path, forge: SandboxForge
) -> None:
    home = Home(tmpfs, forge)
    assert home.run("clients", "add", "acme", "--credits", "10").returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    cause = "read-only file system (EROFS)"
    for args in (
        ["run"],
        ["clients", "add", "bob"],
        ["clients", "fund", "acme", "5"],
        ["status"],
        ["check"],
    ):
        done = home.run(*args)
        assert done.returncode == EXIT_FAILED, (args, done.stderr[-3000:])
        one_error_line(done, str(tmpfs / "state"), cause)
    for args in (["status", "--json"], ["check", "--json"], ["clients", "fund", "acme", "5"]):
        done = home.run(*args, "--json")
        assert done.returncode == EXIT_FAILED, (args, done.stderr[-3000:])
        assert "Traceback" not in done.stderr
        document = json.loads(done.stdout)
        assert document["ok"] is False and document["reason"] == "storage_unavailable"
        assert cause in document["message"]
    missing = home.run("status", "--state-dir", str(tmpfs / "nowhere"))
    assert missing.returncode == EXIT_USAGE
    one_error_line(missing, str(tmpfs / "nowhere"))


class Records(logging.Handler):
    """Keeps every record it is handed, after its filters."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_repeated_errors_are_logged_once_a_minute_and_tracebacks_once_per_cause() -> None:
    now = [1000.0]
    handler = Records()
    handler.addFilter(RepeatFilter(clock=lambda: now[0]))
    log = logging.getLogger("test_storage_faults.repeats")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        for _ in range(50):
            log.error("cannot write %s: %s", "/state/index.json", "no space left")
            log.info("poll cycle done")  # below WARNING: never held back
            now[0] += 1.0
        log.error("another error")
        assert [r.getMessage() for r in handler.records if r.levelno >= logging.ERROR] == [
            "cannot write /state/index.json: no space left",
            "another error",
        ]
        assert sum(r.levelno == logging.INFO for r in handler.records) == 50
        now[0] += 20.0  # 70 s after the first: the next one passes, with the count
        log.error("cannot write %s: %s", "/state/index.json", "no space left")
        assert handler.records[-1].getMessage() == (
            "cannot write /state/index.json: no space left (repeated 49 times in the last 70 s)"
        )
        for attempt in range(3):
            try:
                os.open("/nonexistent-folder/x", os.O_RDONLY)
            except OSError:
                log.exception("step %d failed", attempt)
        traced = [r for r in handler.records if r.getMessage().startswith("step ")]
        assert [r.exc_info is not None for r in traced] == [True, False, False]
        assert "FileNotFoundError: [Errno 2]" in traced[1].getMessage()
        for _ in range(3):  # an audit line (a refused login) is an event: each one counts
            log.warning("sftp: refused session: acme: already 4 sessions", extra=AUDIT)
        audited = [r for r in handler.records if r.getMessage().startswith("sftp: refused")]
        assert len(audited) == 3
    finally:
        log.removeHandler(handler)


def test_an_os_error_under_a_request_answers_by_its_errno_never_a_bare_500() -> None:
    full = os_error_response(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert full.status_code == 507 and full.headers["retry-after"] == "60"
    assert json.loads(full.body)["reason"] == "storage_full"
    path = "/srv/state/index.json"
    refused = os_error_response(PermissionError(errno.EACCES, "Permission denied", path))
    assert refused.status_code == 503
    assert json.loads(refused.body) == {  # the cause, not the service's paths
        "ok": False,
        "reason": "storage_unavailable",
        "message": "the service cannot store anything now: permission denied (EACCES); "
        "try again later",
    }
    other = os_error_response(OSError(errno.EIO, "Input/output error"))
    assert other.status_code == 500 and json.loads(other.body)["reason"] == "error"
    translated = storage_error(PermissionError(errno.EACCES, "Permission denied", path))
    assert str(translated) == f"cannot use {path}: permission denied (EACCES)"
    assert isinstance(translated, OSError) and translated.errno == errno.EACCES  # still one
    assert storage_error(FileNotFoundError(errno.ENOENT, "No such file", path)) is None
