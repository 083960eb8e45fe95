"""One big batch through the service process: its peak memory over its idle RSS, and how
long after the lane closes its last issue its report is in the outbox.

The product is `dropbox-eval run --http-port P` in a child process (default settings, but
SAAS_EVAL_MAX_TASKS and SAAS_EVAL_MAX_FILE_BYTES fit the batch), registered as the forge's
user webhook, so closes are pushed. The sandbox forge (no simulated lane) runs in this
process; this process acts as the lane. Steps:

1. the service idles until its first poll; its RSS then is the idle figure;
2. one `--tasks`-task batch (`--format json` or `jsonl`) is renamed into the inbox; its
   issues are all created;
3. the lane closes every issue (verdict comment, label, close), as fast as it can;
4. the clock runs from the last close until `outbox/<batch_id>.json` exists.

Figures: (VmHWM - idle RSS) per 1,000 tasks, target <= 3 MB; last close -> report, target
<= the settle window (SAAS_EVAL_SETTLE_SECONDS, default 10 s) + 1 s. The baseline in the
same run is the idle service itself (and the settle window, which the report must wait).

5. the forge's limit: a raw `requests` loop (`--raw-threads`) reads every issue's timeline
   once, as the result of each needs (Gitea serves it per issue only): its rate bounds the
   product's, and the last close -> report can be no less than the settle window plus
   the time those reads take past the lane's last close.

    python bench/bigbatch.py [--tasks 50000] [--format json|jsonl] [--settle 10]
                             [--raw-threads 16] [--profile stacks.txt] [--json]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import BenchResult, command_line, emit, make_tasks, parser
from _raw import thread_sessions
from _service import FUNDS, wait_until

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings
from dropbox_eval.sandbox import SandboxForge

TARGET_MB_PER_1000 = 3.0
SLACK_SECONDS = 1.0
SECRET = "bench-bigbatch"


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of process `pid` in KiB."""
    found = {"VmHWM:": 0, "VmRSS:": 0}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            key = line.split(maxsplit=1)[0] if line.strip() else ""
            if key in found:
                found[key] = int(line.split()[1])
    return found["VmHWM:"], found["VmRSS:"]


class RssWatch:
    """Samples a process's VmRSS every 50 ms while its block runs: when its peak came."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = (0, 0.0)  # (KiB, wall-clock time)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError):
                rss = memory_kib(self.pid)[1]
                if rss > self.peak[0]:
                    self.peak = (rss, time.time())


def logged_before(log: Any, moment: float, count: int = 3) -> str:
    """The service's last `count` log messages before `moment` (what it was doing)."""
    log.flush()
    log.seek(0)
    before = []
    for line in log:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            doc = json.loads(line)
            if datetime.fromisoformat(doc["time"]).timestamp() <= moment:
                before.append(str(doc["message"])[:90])
    return " | ".join(before[-count:])


def write_batch(path: Path, tasks: list[dict[str, Any]], form: str) -> None:
    """The batch file as a client writes it: `.part`, fsync, rename into place."""
    part = path.with_name(path.name + ".part")
    with open(part, "w", encoding="utf-8") as handle:
        if form == "jsonl":
            handle.write(json.dumps({"batch_ref": "big"}) + "\n")
            handle.writelines(json.dumps(task) + "\n" for task in tasks)
        else:
            json.dump({"batch_ref": "big", "tasks": tasks}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(part, path)


@contextlib.contextmanager
def profiling(pid: int, path: str | None) -> Iterator[None]:
    """With `path`, py-spy samples process `pid` while the block runs (collapsed stacks)."""
    if not path:
        yield
        return
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "50", "-o", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


def raw_timelines(forge: SandboxForge, repo: str, count: int, threads: int) -> float:
    """Timelines/s of a requests loop reading issues 1..count of `repo` once each."""
    session = thread_sessions(forge)

    def read(number: int) -> None:
        url = f"{forge.url}/api/v1/repos/{repo}/issues/{number}/timeline"
        session().get(url, params={"page": 1, "limit": 50}, timeout=60).raise_for_status()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(read, range(1, count + 1)))
    return count / (time.perf_counter() - started)


def last_result(log: Any) -> float:
    """The wall-clock time of the service's last "task ... finished as" log line."""
    log.flush()
    log.seek(0)
    moments = []
    for line in log:
        if line.startswith("{") and " finished as " in line:
            with contextlib.suppress(ValueError, KeyError):  # two threads' lines run together
                moments.append(json.loads(line)["time"])
    if not moments:
        raise RuntimeError("the service logged no finished task")
    return datetime.fromisoformat(moments[-1]).timestamp()


def run(args: Any) -> tuple[dict[str, float], str]:
    """One batch through a service child; its figures, and what the service logged last
    before its RSS peaked between the last close and the report."""
    out: dict[str, float] = {}
    with SandboxForge(port=0) as forge, tempfile.TemporaryDirectory(prefix="bench-big-") as home:
        port = free_port()
        env = {
            **os.environ,
            "SAAS_EVAL_HOME": home,
            "SAAS_EVAL_GITEA_URL": forge.url,
            "SAAS_EVAL_GITEA_TOKEN": forge.token,
            "SAAS_EVAL_OWNER": forge.user,
            "SAAS_EVAL_MAX_TASKS": str(args.tasks),
            "SAAS_EVAL_MAX_FILE_BYTES": str(400 * args.tasks + 10**6),
            "SAAS_EVAL_CLIENT_QUOTA_BYTES": str(800 * args.tasks + 10**7),
            "SAAS_EVAL_SETTLE_SECONDS": str(args.settle),
            "SAAS_EVAL_FORGE_WEBHOOK_URL": f"http://127.0.0.1:{port}/hooks/forge",
            "SAAS_EVAL_FORGE_WEBHOOK_SECRET": SECRET,
        }
        settings = load_settings(
            home=home, gitea_url=forge.url, gitea_token=forge.token, owner=forge.user
        )
        app = build_app(settings, with_forge=False)
        app.billing.add_client("acme", FUNDS)
        inbox = settings.inbox_path / "acme"
        inbox.mkdir(parents=True)
        log = open(Path(home) / "service.log", "w+", encoding="utf-8")  # noqa: SIM115
        child = subprocess.Popen(
            [sys.executable, "-m", "dropbox_eval", "--log-format", "json", "run"]
            + ["--http-port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            wait_until(lambda: forge.state.hooks.listed(f"owner:{forge.user}"), 60, 0.05)
            time.sleep(2)  # the first poll and the imports it triggers
            out["idle_kib"] = memory_kib(child.pid)[1]
            tasks = make_tasks(args.tasks)
            name = f"big.{args.format}"
            write_batch(inbox / name, tasks, args.format)
            del tasks
            receipt = inbox / "accepted" / f"{name}.receipt.json"
            out["receipt_s"] = wait_until(receipt.exists, 3600, 0.01)
            out["peak_receipt_kib"] = memory_kib(child.pid)[0]
            batch_id = json.loads(receipt.read_text(encoding="utf-8"))["batch_id"]
            started = time.perf_counter()
            wait_until(lambda: app.store.get_batch(batch_id).intake_done, 3600, 0.2)
            out["open_s"] = time.perf_counter() - started
            out["peak_open_kib"] = memory_kib(child.pid)[0]
            owner, repo = app.store.get_batch(batch_id).repo.split("/", 1)
            started = time.perf_counter()
            for number in range(1, args.tasks + 1):
                if args.pace:
                    time.sleep(max(0.0, started + number / args.pace - time.perf_counter()))
                forge.finish_issue(
                    owner, repo, number, comment="Verdict: pass.", labels=["eval-pass"]
                )
            last_close = time.perf_counter()
            out["peak_closed_kib"] = memory_kib(child.pid)[0]
            out["close_s"] = last_close - started
            report = settings.outbox_path / f"{batch_id}.json"
            with profiling(child.pid, args.profile), RssWatch(child.pid) as watch:
                wait_until(report.exists, 3600, 0.005)
                out["report_after_last_close_s"] = time.perf_counter() - last_close
                time.sleep(1)  # archiving follows the delivery
            out["close_peak_rss_kib"] = watch.peak[0]
            peak_logged = logged_before(log, watch.peak[1])
            out["peak_kib"], out["rss_kib"] = memory_kib(child.pid)
            out["report_bytes"] = report.stat().st_size
            out["report_after_last_result_s"] = report.stat().st_mtime - last_result(log)
            out["raw_timelines_per_s"] = raw_timelines(
                forge, f"{owner}/{repo}", args.tasks, args.raw_threads
            )
        finally:
            child.terminate()
            child.wait(timeout=120)
    return out, peak_logged


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--tasks", type=int, default=50_000)
    args_parser.add_argument("--format", choices=("json", "jsonl"), default="json")
    args_parser.add_argument("--settle", type=float, default=10.0)
    args_parser.add_argument(
        "--pace", type=float, default=0.0, help="the lane's closes per second (0: at once)"
    )
    args_parser.add_argument("--raw-threads", type=int, default=16)
    args_parser.add_argument(
        "--profile",
        help="py-spy's collapsed stacks of the service from the last close to "
        "the report, into this file",
    )
    args = args_parser.parse_args()
    started = time.perf_counter()
    out, peak_logged = run(args)
    per_1000 = (out["peak_kib"] - out["idle_kib"]) / 1024 / (args.tasks / 1000)
    result = BenchResult("bigbatch", command_line())
    result.add("idle service RSS (baseline)", out["idle_kib"] / 1024, "MB")
    result.add(
        f"peak above idle per 1,000 tasks ({args.tasks} tasks, {args.format})",
        per_1000,
        "MB",
        f"<= {TARGET_MB_PER_1000:.0f} MB",
        per_1000 <= TARGET_MB_PER_1000,
        note=f"VmHWM {out['peak_kib'] / 1024:.0f} MB, idle RSS {out['idle_kib'] / 1024:.0f} MB, "
        f"RSS at the end {out['rss_kib'] / 1024:.0f} MB",
    )
    target = args.settle + SLACK_SECONDS
    result.add(
        "last issue closed -> report in the outbox",
        out["report_after_last_close_s"],
        "s",
        f"<= {target:g} s",
        out["report_after_last_close_s"] <= target,
        note=f"settle window {args.settle:g} s (the baseline: a result is final only then)",
    )
    raw = out["raw_timelines_per_s"]
    floor = args.settle + max(0.0, args.tasks / raw - out["close_s"])
    result.add(
        "the forge's limit: last close -> report, from a raw loop's timeline reads",
        floor,
        "s",
        note=f"settle {args.settle:g} s + {args.tasks} timelines at {raw:.0f}/s "
        f"({args.raw_threads} threads) past the lane's {out['close_s']:.1f} s of closes; "
        f"the product / this limit: {out['report_after_last_close_s'] / floor:.2f}",
    )
    result.add(
        "last result recorded -> report in the outbox",
        out["report_after_last_result_s"],
        "s",
        f"<= {SLACK_SECONDS:g} s",
        out["report_after_last_result_s"] <= SLACK_SECONDS,
        note="the batch's close (final charge, report fixed) and its delivery",
    )
    result.info["peak (VmHWM) by phase, MB"] = " ".join(
        f"{name} {out[key] / 1024:.0f}"
        for name, key in (
            ("receipt", "peak_receipt_kib"),
            ("issues open", "peak_open_kib"),
            ("closed", "peak_closed_kib"),
            ("report", "peak_kib"),
        )
    )
    result.info["the close's RSS peak"] = (
        f"{out['close_peak_rss_kib'] / 1024:.0f} MB, after: {peak_logged}"
    )
    result.info["phases"] = (
        f"drop -> receipt {out['receipt_s']:.1f} s; receipt -> every issue open "
        f"{out['open_s']:.0f} s; the lane's {args.tasks} closes {out['close_s']:.0f} s; "
        f"report {out['report_bytes'] / 1e6:.1f} MB"
    )
    result.info["setup"] = (
        "`dropbox-eval run --http-port` in a child process (default settings but the task "
        "and size limits), pushed closes (forge webhook); in-process sandbox forge without "
        "a lane, this process closing the issues; one repo per batch; state on local disk"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
