"""Drop-to-issues latency: a 10-task batch file renamed into the inbox -> its issues exist.

A real `Service` (watchdog observer, service loop) runs in a background thread against an
in-process sandbox forge. Each drop writes `inbox/bench/bN.json.part`, fsyncs it, then
renames it to `bN.json` (an atomic upload); the clock runs from the rename until the forge
has answered 201 to all 10 issue creations (read from the forge's request log every 2 ms).
A rename into place is read at once (inotify), so the quiet period should not matter:
measured with the default quiet period (1 s) and with 0.05 s. For context, drops written
in place (`bN.json` opened, written, fsynced, closed; the clock starts at the close) still
wait the default quiet period.

Then, with 40 ms of forge latency (see `_push.py`): lane closes an issue -> result stored
with webhooks on and a 30 s poll interval; and drop -> receipt of a 10-task batch against
2 x the round trip + the creation time of its issues.

    python bench/latency.py [--drops 20] [--tasks 10] [--closes 20] [--push-drops 10]
                            [--delay 0.04] [--json]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import BenchResult, command_line, emit, make_tasks, parser, percentile, settings_for
from _push import push_figures

from dropbox_eval.app import build_app, service_for
from dropbox_eval.sandbox import SandboxForge

TARGET_P50_MS = 100.0
WAIT_LIMIT = 30.0


def created(forge: SandboxForge) -> int:
    """Issues the forge has created since its log was last cleared."""
    return sum(
        1
        for e in forge.requests
        if e.method == "POST" and e.path.endswith("/issues") and e.status == 201
    )


def write(path: Path, index: int, tasks: int) -> None:
    """Write one batch file and fsync it."""
    data = json.dumps({"batch_ref": f"drop-{index}", "tasks": make_tasks(tasks, f"d{index}-")})
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def measure(
    forge: SandboxForge, quiet: float, drops: int, tasks: int, rename: bool = True
) -> tuple[list[float], list[float]]:
    """(drop -> issues exist, drop -> receipt written) in seconds, one pair per drop."""
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as home:
        settings = settings_for(
            home, forge.url, forge.token, forge.user, quiet_period=quiet, poll_interval=3600
        )
        app = build_app(settings)
        app.billing.add_client("bench", 0)
        inbox = settings.inbox_path / "bench"
        inbox.mkdir(parents=True)
        accepted = inbox / "accepted"
        service = service_for(app)
        thread = threading.Thread(target=service.run, name="bench-service", daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while service.status.get("last_poll_at") is None:  # loop up, watcher running
            if time.monotonic() > deadline:
                raise RuntimeError("service did not start")
            time.sleep(0.01)
        issues: list[float] = []
        receipts: list[float] = []
        try:
            for index in range(drops + 1):  # drop 0 warms up and is not counted
                final = inbox / f"b{index}.json"
                forge.clear_requests()
                if rename:
                    part = final.with_name(f"{final.name}.part")  # not a candidate name
                    write(part, index, tasks)
                    start = time.perf_counter()
                    os.rename(part, final)
                else:
                    write(final, index, tasks)
                    start = time.perf_counter()
                end = start + WAIT_LIMIT
                while created(forge) < tasks:
                    if time.perf_counter() > end:
                        raise RuntimeError(f"drop {index}: issues not created in time")
                    time.sleep(0.002)
                got_issues = time.perf_counter()
                while not (accepted / f"b{index}.json.receipt.json").exists():
                    if time.perf_counter() > end:
                        raise RuntimeError(f"drop {index}: no receipt in time")
                    time.sleep(0.002)
                got_receipt = time.perf_counter()
                if index:
                    issues.append(got_issues - start)
                    receipts.append(got_receipt - start)
        finally:
            service.stop()
            thread.join(timeout=30)
    return issues, receipts


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=20)
    args_parser.add_argument("--tasks", type=int, default=10)
    args_parser.add_argument("--closes", type=int, default=20)
    args_parser.add_argument("--push-drops", type=int, default=10)
    args_parser.add_argument("--delay", type=float, default=0.04)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("latency", command_line())
    variants = [
        (1.0, True, "rename, default quiet_period=1.0"),
        (0.05, True, "rename, quiet_period=0.05"),
        (1.0, False, "in-place write, default quiet_period=1.0 (context)"),
    ]
    with SandboxForge(port=0) as forge:
        for quiet, rename, label in variants:
            issues, receipts = measure(forge, quiet, args.drops, args.tasks, rename)
            p50 = percentile(issues, 50) * 1000
            p95 = percentile(issues, 95) * 1000
            note = (
                f"min {min(issues) * 1000:.0f} ms, max {max(issues) * 1000:.0f} ms; "
                f"receipt written at p50 {statistics.median(receipts) * 1000:.0f} ms"
            )
            if rename:
                result.add(
                    f"{label}: p50",
                    p50,
                    "ms",
                    f"<= {TARGET_P50_MS:.0f} ms",
                    p50 <= TARGET_P50_MS,
                    note=note,
                )
            else:
                result.add(
                    f"{label}: p50", p50, "ms", note=note + "; the quiet period is the floor"
                )
            result.add(f"{label}: p95", p95, "ms")
    result.info["setup"] = (
        f"{args.drops} drops (+1 warm-up) of {args.tasks}-task batches per "
        "variant; Service.run in a thread with the inotify observer; "
        "in-process SandboxForge; state on local disk"
    )
    push_figures(result, args.closes, args.push_drops, args.delay)
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
