"""SFTP upload -> issues exist: the built-in endpoint against OpenSSH's sftp-server.

A real `Service` (inotify watcher, default quiet period 1 s) runs in a thread against an
in-process sandbox forge; every variant uploads the same 10-task batch files with the real
OpenSSH `sftp` client, in one long-lived batch session per variant (`sftp -b -` reads one
command line at a time), so connection set-up is not counted. The clock runs from the
moment the command line is written to the client until the forge has answered 201 to all
issue creations.

- built-in: `dropbox-eval sftp` (a subprocess on the same home), `put bN.json`; the upload
  is renamed into place on close, so the watcher reads it at once.
- OpenSSH, in place: `sftp -D /usr/lib/openssh/sftp-server` (no sshd; the server runs in the
  client folder), `put bN.json`: written in place, so the service waits the quiet period.
- OpenSSH, rename: the same server, `put bN.json bN.json.part` then `rename` (the client
  uses posix-rename@openssh.com, a real rename(2)), read at once.

    python bench/sftp.py [--drops 20] [--tasks 10] [--json]
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _common import BenchResult, command_line, emit, make_tasks, parser, percentile, settings_for

from dropbox_eval.app import build_app, service_for
from dropbox_eval.config import Settings
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sftp.keys import KeyStore

SFTP_SERVER = "/usr/lib/openssh/sftp-server"
TARGET_P50_MS = 100.0
TARGET_RATIO = 0.5
WAIT_LIMIT = 30.0

Send = Callable[[int], None]


def created(forge: SandboxForge) -> int:
    """Issues the forge has created since its log was last cleared."""
    return sum(
        1
        for e in forge.requests
        if e.method == "POST" and e.path.endswith("/issues") and e.status == 201
    )


@contextlib.contextmanager
def batch_session(argv: list[str], cwd: Path) -> Iterator[Callable[[str], None]]:
    """A long-lived `sftp -b -` process; yields a function that sends command lines."""
    proc = subprocess.Popen(
        [*argv, "-b", "-"] if "-D" in argv else [*argv[:-1], "-b", "-", argv[-1]],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    assert proc.stdin is not None

    def send(lines: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(lines)
        proc.stdin.flush()

    try:
        yield send
    finally:
        proc.stdin.close()
        assert proc.stderr is not None
        err = proc.stderr.read()
        if proc.wait(timeout=30):
            raise RuntimeError(f"sftp exited {proc.returncode}: {err.strip()}")


@contextlib.contextmanager
def builtin_endpoint(settings: Settings, source: Path) -> Iterator[Send]:
    """`dropbox-eval sftp` on the bench home, and an OpenSSH client logged in as `bench`."""
    key = source / "bench-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    KeyStore(settings.state_path).add("bench", key.with_suffix(".pub").read_text())
    env = {**os.environ, "SAAS_EVAL_HOME": str(settings.home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "dropbox_eval", "sftp", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdout is not None
    port = server.stdout.readline().rsplit(":", 1)[-1].strip()
    argv = [
        "sftp",
        "-F",
        "/dev/null",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-i",
        str(key),
        "-P",
        port,
        "bench@127.0.0.1",
    ]
    try:
        with batch_session(argv, source) as send:
            yield lambda index: send(f"put b{index}.json\n")
    finally:
        server.terminate()
        server.wait(timeout=20)


@contextlib.contextmanager
def openssh_server(inbox: Path, source: Path, rename: bool) -> Iterator[Send]:
    """OpenSSH's sftp-server over a pipe (`sftp -D`), working in the client folder."""
    with batch_session(["sftp", "-D", SFTP_SERVER], inbox) as send:
        if rename:
            yield lambda index: send(
                f"put {source}/b{index}.json b{index}.json.part\n"
                f"rename b{index}.json.part b{index}.json\n"
            )
        else:
            yield lambda index: send(f"put {source}/b{index}.json b{index}.json\n")


def measure(forge: SandboxForge, variant: str, drops: int, tasks: int) -> list[float]:
    """Seconds from the put command to all issues created, one per drop (after a warm-up)."""
    with tempfile.TemporaryDirectory(prefix="bench-sftp-") as home:
        settings = settings_for(home, forge.url, forge.token, forge.user, poll_interval=3600)
        app = build_app(settings)
        app.billing.add_client("bench", 0)
        inbox = settings.inbox_path / "bench"
        inbox.mkdir(parents=True)
        source = Path(home) / "source"
        source.mkdir()
        for index in range(drops + 1):
            data = {"batch_ref": f"drop-{index}", "tasks": make_tasks(tasks, f"d{index}-")}
            (source / f"b{index}.json").write_text(json.dumps(data), encoding="utf-8")
        service = service_for(app)
        thread = threading.Thread(target=service.run, name="bench-service", daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while service.status.get("last_poll_at") is None:
            if time.monotonic() > deadline:
                raise RuntimeError("service did not start")
            time.sleep(0.01)
        client = (
            builtin_endpoint(settings, source)
            if variant == "builtin"
            else openssh_server(inbox, source, rename=variant == "rename")
        )
        try:
            with client as send:
                return drop_all(forge, send, drops, tasks)
        finally:
            service.stop()
            thread.join(timeout=30)


def drop_all(forge: SandboxForge, send: Send, drops: int, tasks: int) -> list[float]:
    """Send each drop and wait for its issues; drop 0 warms up and is not counted."""
    timings: list[float] = []
    for index in range(drops + 1):
        forge.clear_requests()
        start = time.perf_counter()
        send(index)
        while created(forge) < tasks:
            if time.perf_counter() > start + WAIT_LIMIT:
                raise RuntimeError(f"drop {index}: issues not created in time")
            time.sleep(0.002)
        if index:
            timings.append(time.perf_counter() - start)
    return timings


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=20)
    args_parser.add_argument("--tasks", type=int, default=10)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("sftp", command_line())
    labels = {
        "builtin": "built-in endpoint, put",
        "inplace": "OpenSSH sftp-server, in-place put (baseline)",
        "rename": "OpenSSH sftp-server, put .part + rename",
    }
    p50: dict[str, float] = {}
    with SandboxForge(port=0) as forge:
        for variant, label in labels.items():
            timings = measure(forge, variant, args.drops, args.tasks)
            p50[variant] = percentile(timings, 50) * 1000
            note = (
                f"p95 {percentile(timings, 95) * 1000:.0f} ms, min "
                f"{min(timings) * 1000:.0f} ms, max {max(timings) * 1000:.0f} ms"
            )
            if variant == "builtin":
                result.add(
                    f"{label}: p50",
                    p50[variant],
                    "ms",
                    f"<= {TARGET_P50_MS:.0f} ms",
                    p50[variant] <= TARGET_P50_MS,
                    note=note,
                )
            else:
                result.add(f"{label}: p50", p50[variant], "ms", note=note)
    ratio = p50["builtin"] / p50["inplace"]
    result.add(
        "built-in / OpenSSH in-place (p50)",
        ratio,
        "",
        f"<= {TARGET_RATIO}",
        ratio <= TARGET_RATIO,
        note="same run; the baseline waits the 1 s quiet period",
    )
    result.add(
        "built-in / OpenSSH rename (p50)",
        p50["builtin"] / p50["rename"],
        "",
        note="context: the same rename into place, done by the client",
    )
    result.info["setup"] = (
        f"{args.drops} drops (+1 warm-up) of {args.tasks}-task batches per "
        "variant; OpenSSH sftp client in one batch session per variant; "
        "Service.run in a thread (inotify, quiet_period 1 s); in-process "
        "SandboxForge; built-in endpoint in a subprocess over loopback TCP"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
