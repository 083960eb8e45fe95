"""A full, read-only or refused disk is a named state: `/readyz` says which folder and why,
the API answers 507 `storage_full`, `/metrics` keeps answering, the log does not flood, and
everything resumes by itself when space returns. The command line says so in one line. A
step whose side effect happened (a report sent) but whose record could not be written
does not happen again in a loop; no step is tried every tick while storage fails.

Real parts: a `dropbox-eval run --http-port 0` child whose home is a 4 MiB tmpfs mounted
here (CI runs as root), filled to ENOSPC with a filler file, then remounted read-only; a
loopback callback receiver that fills the disk as it takes the report.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import forkrun
import pytest
import requests
from conftest import PATIENCE, metric, read_json, readiness, settings_on, tasks, wait_for
from test_pause import Running
from test_retry import Home

from dropbox_eval.app import App, build_app
from dropbox_eval.errors import (
    EXIT_FAILED,
    EXIT_USAGE,
    ForgeRetryable,
    StorageFull,
    StorageUnavailable,
    storage_error,
)
from dropbox_eval.inbox.sweep import StaleUploads
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util import storage
from dropbox_eval.util.fileio import write_atomically
from dropbox_eval.util.logfilter import AUDIT, RepeatFilter
from dropbox_eval.web.problems import os_error_response
from dropbox_eval.workers.guard import guarded

MAX_TRACEBACKS = 10


class QuickHome(Home):
    """A home whose service rescans its inbox every second: a drop that met the full disk
    is taken again at the next rescan (30 s by default)."""

    def env(self) -> dict[str, str]:
        return super().env() | {"SAAS_EVAL_RESCAN_INTERVAL": "1"}


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """`folder` (made here) as a tmpfs of `size`, unmounted at the end whatever happened."""
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own."""
    with mounted_tmpfs(tmp_path / "disk", "4m") as folder:
        yield folder


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


def post(url: str, key: str, ref: str, count: int = 1, **fields: str) -> requests.Response:
    return requests.post(
        f"{url}/api/eval/batches",
        json={"batch_ref": ref, "tasks": tasks(count), **fields},
        headers={"Authorization": f"Bearer {key}"},
        timeout=PATIENCE,
    )


def one_error_line(done: forkrun.Finished, *words: str) -> None:
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

    last = tmpfs / "inbox" / "acme" / "last.json"  # a cron job's pass on a full disk fails
    write_atomically(last, json.dumps({"batch_ref": "last", "tasks": tasks(1)}))
    fill(filler)
    once = home.run("run", "--once")
    assert once.returncode == EXIT_FAILED, once.stderr[-3000:]
    failed = [line for line in once.stderr.splitlines() if " ERROR run --once: " in line]
    assert len(failed) == 1, once.stderr[-3000:]
    assert f"failed on storage, first: file {last}: cannot write" in failed[0]
    assert failed[0].endswith("no space left on device (ENOSPC); exit 1")
    assert last.exists()  # left for the next pass


def test_commands_on_a_read_only_or_missing_state_folder_say_one_line(
    tmpfs: Path, forge: SandboxForge
) -> None:
    home = Home(tmpfs, forge)
    assert home.run("clients", "add", "acme", "--credits", "10").returncode == 0
    service = Running(home)

    def inbox_worker_state() -> str | None:
        return home.json("status").get("workers", {}).get("inbox-worker", {}).get("state")

    assert wait_for(lambda: inbox_worker_state() == "running")  # written before read-only
    state = tmpfs / "state"  # read-only from now on for every new open (the service's
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)  # open locks
    subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)  # stay)
    cause = "read-only file system (EROFS)"
    try:  # the running service: readiness names the folder, the metrics still see it
        assert wait_for(lambda: readiness(service.url)[0] == 503), readiness(service.url)
        checks = readiness(service.url)[1]["checks"]
        assert f"state folder {tmpfs / 'state'}: {cause}" in checks["storage"], checks
        assert checks["workers"] == "ok", checks
        scrape = requests.get(f"{service.url}/metrics", timeout=PATIENCE).text
        assert "dropbox_eval_service_running 1.0" in scrape, scrape
        assert 'dropbox_eval_worker_up{worker="inbox-worker"} 1.0' in scrape, scrape
        assert 'dropbox_eval_worker_restarts_total{worker="forge-worker"} 0.0' in scrape
    finally:
        service.stop()
        subprocess.run(["umount", str(state)], check=True)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
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


class FillingReceiver:
    """A loopback callback receiver that, once armed, fills `filler`'s disk as it takes a
    report, then answers 200: the report went out; its record cannot be written."""

    def __init__(self) -> None:
        self.posts: list[str] = []  # the webhook-id of each POST
        self.filler: Path | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.posts.append(self.headers["webhook-id"])
                if receiver.filler is not None:
                    fill(receiver.filler)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def small_outbox(tmpfs: Path) -> Iterator[Path]:
    """`outbox/` on a 64 KiB tmpfs of its own, inside the home's."""
    with mounted_tmpfs(tmpfs / "outbox", "64k") as folder:
        yield folder


@pytest.mark.slow
def test_a_report_sent_but_not_recorded_is_not_sent_again_and_a_nearly_full_outbox_is_named(
    tmpfs: Path, small_outbox: Path, forge: SandboxForge
) -> None:
    home = QuickHome(tmpfs, forge)
    assert home.run("clients", "add", "acme", "--credits", "100").returncode == 0
    key = home.json("clients", "api-key", "acme")["api_key"]
    receiver = FillingReceiver()
    service = Running(home, {"SAAS_EVAL_CALLBACK_ALLOW": "127.0.0.1"})
    try:
        hooked = post(service.url, key, "hooked", callback_url=receiver.url).json()["batch_id"]
        filed = post(service.url, key, "filed", count=3).json()["batch_id"]
        nearly = small_outbox / "filler"
        fill(nearly)
        with nearly.open("r+b") as handle:  # one block left: a probe fits, no report does
            handle.truncate(handle.seek(0, os.SEEK_END) - 4096)
        long_summary = f"<!-- controller:fingerprint:x -->\n{'long ' * 400}"
        home.finish(filed, comment=long_summary)  # a report of more than one block
        outbox = f"outbox {small_outbox}: cannot write {small_outbox / f'{filed}.json'}"

        def outbox_named() -> bool:
            code, body = readiness(service.url)
            return code == 503 and body["checks"]["storage"].startswith(outbox)

        assert wait_for(outbox_named), readiness(service.url)[1]["checks"]["storage"]
        assert "no space left on device (ENOSPC)" in readiness(service.url)[1]["checks"]["storage"]
        assert metric(service.url, 'dropbox_eval_storage_writable{folder="outbox"}') == 0
        assert metric(service.url, 'dropbox_eval_storage_writable{folder="state"}') == 1
        fill(small_outbox / "rest")  # quite full now: any process sees it, not the service alone
        full = f"outbox {small_outbox}: no space left on device (ENOSPC)"
        assert f"storage: {full}" in home.run("status").stdout
        checked = home.run("check")
        assert checked.returncode == 1 and f"needs a person: {full}" in checked.stdout
        (small_outbox / "rest").unlink()
        nearly.unlink()  # its next try writes it (and clears the outbox's state)

        receiver.filler = tmpfs / "filler"  # the state disk fills as the report arrives
        home.finish(hooked)
        recording = (
            f"batch {hooked}: report delivered to {receiver.url} (HTTP 200) but not recorded"
        )
        assert wait_for(lambda: f"{recording} (try 3;" in "".join(service.lines)), service.lines
        assert receiver.posts == [f"msg_{hooked}"]  # three tries wrote, none sent again
        tries = [line for line in service.lines if recording in line]
        assert "recording again in 1 s, without sending it again): cannot write" in tries[0]
        assert "no space left on device (ENOSPC)" in tries[0]

        receiver.filler = None
        (tmpfs / "filler").unlink()  # space returns: nothing to restart, nothing to repair
        for batch_id in (hooked, filed):
            assert wait_for(lambda b=batch_id: home.json("batch", b)["status"] == "emitted")
        assert receiver.posts == [f"msg_{hooked}"]
        assert json.loads((small_outbox / f"{filed}.json").read_text())["batch_id"] == filed
        assert wait_for(lambda: readiness(service.url)[0] == 200), readiness(service.url)
        assert metric(service.url, 'dropbox_eval_storage_writable{folder="outbox"}') == 1
        delivered = 'dropbox_eval_deliveries_total{outcome="delivered"}'
        assert metric(service.url, delivered) == 2  # one POST, one outbox file
        client = home.json("clients", "show", "acme")
        assert client["held"] == 0 and client["balance"] == 100 - 1 - 3  # charged once each
    finally:
        receiver.close()
        if service.process.poll() is None:
            service.stop()
    assert "Traceback" not in "".join(service.lines)


def test_a_drop_that_storage_refused_waits_and_is_not_accepted_twice(
    tmpfs: Path, tmp_path: Path, forge: SandboxForge, caplog: pytest.LogCaptureFixture
) -> None:
    app = build_app(settings_on(forge, tmp_path / "home", inbox=tmpfs / "inbox"))
    app.billing.add_client("acme", 10)
    drop = app.inbox.root / "acme" / "x.json"
    write_atomically(drop, json.dumps({"batch_ref": "x", "tasks": tasks(1)}))
    fill(tmpfs / "filler")  # the inbox is full: the batch is recorded, its receipt is not
    caplog.set_level(logging.INFO, logger="dropbox_eval")
    with pytest.raises(StorageFull, match=r"x\.json\.receipt\.json: no space left"):
        app.inbox.process(drop)
    assert app.inbox.process(drop).document["reason"] == "storage"  # waits: not read again
    assert sum("x.json: reading" in m for m in caplog.messages) == 1
    (tmpfs / "filler").unlink()
    assert wait_for(lambda: app.inbox.process(drop).status == "accepted")
    accepted = [m for m in caplog.messages if "accepted 1 tasks from acme" in m]
    assert len(accepted) == 1  # the second look files the batch the first one recorded
    assert any("recorded before from acme/x.json; filing it" in m for m in caplog.messages)
    assert [row.batch_ref for row in app.store.list_batches()] == ["x"]
    assert storage.probe("inbox", drop.parent / "accepted" / "x.json") is None  # a file


def test_a_visit_that_storage_refused_is_not_due_again_at_the_next_tick(
    app: App, funded: str
) -> None:
    batch_id = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    attempts = app.lifecycle.attempts

    def refused() -> None:
        raise StorageFull(errno.ENOSPC, app.settings.state_path / "index.json")

    with pytest.raises(StorageFull):
        app.lifecycle.visit(batch_id, refused)
    batch = app.store.get_batch(batch_id)
    assert batch.next_attempt_at is None  # nothing could be stored: the wait is in memory
    assert not attempts.is_due(batch) and 0 < attempts.retry_in(batch) <= 1.0
    app.lifecycle.visit(batch_id, lambda: None)  # a visit that worked: due again
    assert attempts.is_due(app.store.get_batch(batch_id))


def test_a_step_that_meets_a_read_only_folder_is_a_storage_warning_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An OSError no writer translated (a `mkdir` of `accepted/` in a read-only client
    folder) still reaches the worker as the storage state it is."""
    reported: list[Exception] = []

    def step() -> None:
        raise OSError(errno.EROFS, "Read-only file system", "accepted")

    with caplog.at_level(logging.WARNING, logger="dropbox_eval"):
        guarded("file inbox/acme/x.json", lambda _what, exc: reported.append(exc), step)
    assert [type(error) for error in reported] == [StorageUnavailable]
    assert [r.getMessage() for r in caplog.records] == [
        "file inbox/acme/x.json: cannot write accepted: read-only file system (EROFS)"
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_a_forge_error_that_cannot_be_stored_waits_too(tmpfs: Path, forge: SandboxForge) -> None:
    """The disk fills between a forge error and its record: the batch waits all the same
    (no stored instant could say so), instead of being tried again at once, forever."""
    app = build_app(settings_on(forge, tmpfs))
    app.billing.add_client("acme", 10)
    batch_id = app.intake.submit_batch("acme", tasks(1))["batch_id"]

    def forge_down() -> None:
        raise ForgeRetryable("the forge answered 503", 503)

    fill(tmpfs / "filler")
    try:
        with pytest.raises(StorageFull):
            app.lifecycle.visit(batch_id, forge_down)
        batch = app.store.get_batch(batch_id)
        assert batch.attempts == 0  # the failed visit could not be stored
        assert not app.lifecycle.attempts.is_due(batch)
    finally:
        (tmpfs / "filler").unlink()


def test_a_stale_upload_that_cannot_be_removed_is_said_and_the_sweep_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inbox = tmp_path / "inbox"
    (inbox / "acme").mkdir(parents=True)
    for name in ("a.json.part", "b.json.part"):
        (inbox / "acme" / name).write_text("{")
    subprocess.run(["mount", "--bind", str(inbox), str(inbox)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(inbox)], check=True)
        with caplog.at_level(logging.WARNING, logger="dropbox_eval"):
            removed = StaleUploads(inbox, 1.0, clock=lambda: time.time() + 60).sweep()
    finally:
        subprocess.run(["umount", "-l", str(inbox)], check=False)
    assert removed == []
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stale upload")]
    assert len(left) == 2 and all("read-only file system (EROFS)" in line for line in left)
