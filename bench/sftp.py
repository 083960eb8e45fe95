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

Two more parts run in the same call (issue 31):

- uploads: 500 small files and one 20 MB file through the built-in endpoint against
  OpenSSH's sshd + sftp-server over the same SSH transport (_sftp_uploads.py);
- listing: another client's `stat` while a client with 2,000 batches lists `reports/`,
  against the same `stat` when quiet (_sftp_listing.py).

    python bench/sftp.py [--drops 20] [--tasks 10] [--uploads 500] [--big-mb 20]
        [--rounds 3] [--listing 2000] [--listings 10] [--only drops,uploads,listing] [--json]
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _common import BenchResult, command_line, emit, make_tasks, parser, percentile, settings_for
from _sftp_listing import listing_figures
from _sftp_servers import SFTP_SERVER, client_argv, keygen
from _sftp_servers import builtin_endpoint as endpoint_process
from _sftp_uploads import upload_figures

from dropbox_eval.app import build_app, service_for
from dropbox_eval.config import Settings
from dropbox_eval.sandbox import SandboxForge

PARTS = ("drops", "uploads", "listing")
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
    key = keygen(source / "bench-key")
    with endpoint_process(settings.home, {"bench": key}) as server:
        argv = client_argv(server.port, key, "bench")
        argv.remove("-b")
        argv.remove("-")
        with batch_session(argv, source) as send:
            yield lambda index: send(f"put b{index}.json\n")


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
    args_parser.add_argument("--uploads", type=int, default=500)
    args_parser.add_argument("--big-mb", type=int, default=20)
    args_parser.add_argument("--rounds", type=int, default=3)
    args_parser.add_argument("--listing", type=int, default=2000)
    args_parser.add_argument("--listings", type=int, default=10)
    args_parser.add_argument("--only", default=",".join(PARTS), help="parts to run")
    args = args_parser.parse_args()
    parts = args.only.split(",")
    started = time.perf_counter()
    result = BenchResult("sftp", command_line())
    if "drops" in parts:
        drop_figures(result, args.drops, args.tasks)
    if "uploads" in parts:
        upload_figures(result, args.uploads, args.big_mb, args.rounds)
    if "listing" in parts:
        listing_figures(result, args.listing, args.listings)
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


def drop_figures(result: BenchResult, drops: int, tasks: int) -> None:
    """Put -> issues exist, built-in endpoint against OpenSSH's sftp-server (in place and
    with a rename)."""
    labels = {
        "builtin": "built-in endpoint, put",
        "inplace": "OpenSSH sftp-server, in-place put (baseline)",
        "rename": "OpenSSH sftp-server, put .part + rename",
    }
    p50: dict[str, float] = {}
    with SandboxForge(port=0) as forge:
        for variant, label in labels.items():
            timings = measure(forge, variant, drops, tasks)
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
    result.info["drops setup"] = (
        f"{drops} drops (+1 warm-up) of {tasks}-task batches per "
        "variant; OpenSSH sftp client in one batch session per variant; "
        "Service.run in a thread (inotify, quiet_period 1 s); in-process "
        "SandboxForge; built-in endpoint in a subprocess over loopback TCP"
    )


if __name__ == "__main__":
    main()
