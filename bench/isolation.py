"""Isolation: client B's drop -> issues latency with healthy peers, and with a broken client A.

One run, two configurations, the same Service and sandbox forge:

- healthy: client B drops 10-task batches (written to `bN.json.part`, renamed into place);
  client A is idle;
- broken peers: client A's repos answer 503 to every request (A has running batches there,
  which every poll cycle visits until their backoff grows), and A has finished batches
  whose callback is a server that accepts the connection and never answers (callback
  timeout 10 s, so each delivery holds its connection for 10 s).

The figure is B's rename -> all 10 issues created (from the sandbox's request log), p50.
Target: broken / healthy <= 1.5.

    python bench/isolation.py [--drops 40] [--json]
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time

from _common import BenchResult, command_line, emit, make_tasks, parser, percentile, settings_for
from _service import drop

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.sandbox import SandboxForge

TASKS = 10
TARGET_RATIO = 1.5
WAIT_LIMIT = 30.0
STUCK_DELIVERIES = 6
RUNNING = 6
ROUNDS = 4


def created_for(forge: SandboxForge, client: str) -> int:
    """Issues the forge created in `client`'s repos since the log was last cleared."""
    return sum(
        1
        for e in forge.requests
        if e.method == "POST"
        and f"/eval-{client}-" in e.path
        and e.path.endswith("/issues")
        and e.status == 201
    )


def break_client_a(app: App, forge: SandboxForge, hanging_url: str) -> None:
    """Finished batches with a callback that hangs, running ones, then A's repos answer 503."""
    for n in range(STUCK_DELIVERIES):
        batch = app.intake.submit_batch(
            "alpha", make_tasks(1, f"s{n}-"), callback_url=hanging_url, batch_ref=f"stuck-{n}"
        )
        app.lifecycle.cancel(batch["batch_id"])
    for n in range(RUNNING):
        app.intake.submit_batch("alpha", make_tasks(TASKS, f"r{n}-"), batch_ref=f"run-{n}")
    forge.fail_next(10**9, 503, path_contains="/eval-alpha-")


def measure(forge: SandboxForge, drops: int, broken: bool, hanging_url: str) -> list[float]:
    """B's rename -> issues exist, in seconds, one per drop (after one warm-up drop)."""
    with tempfile.TemporaryDirectory(prefix="bench-isolation-") as home:
        settings = settings_for(
            home,
            forge.url,
            forge.token,
            forge.user,
            quiet_period=1.0,
            poll_interval=0.5,
            callback_allow="127.0.0.1",
            callback_timeout=10.0,
            retry_base=0.5,
        )
        app = build_app(settings)
        for client in ("alpha", "bravo"):
            app.billing.add_client(client, 0)
            (settings.inbox_path / client).mkdir(parents=True)
        if broken:
            break_client_a(app, forge, hanging_url)
        service = service_for(app)
        thread = threading.Thread(target=service.run, name="bench-service", daemon=True)
        thread.start()
        latencies: list[float] = []
        try:
            time.sleep(1.0)  # workers up; A's stuck deliveries are in flight
            for index in range(drops + 1):
                forge.clear_requests()
                ref = f"b{index}"
                document = {"batch_ref": ref, "tasks": make_tasks(TASKS, f"{ref}-")}
                start = drop(settings.inbox_path / "bravo", f"{ref}.json", document)
                end = start + WAIT_LIMIT
                while created_for(forge, "bravo") < TASKS:
                    if time.perf_counter() > end:
                        raise RuntimeError(f"drop {index}: B's issues not created in time")
                    time.sleep(0.002)
                if index:
                    latencies.append(time.perf_counter() - start)
        finally:
            service.stop()
            thread.join(timeout=60)
            forge.state.faults.clear()
    return latencies


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--drops", type=int, default=40)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("isolation", command_line())
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(64)  # accepts and never answers
    hanging_url = f"http://127.0.0.1:{hanging.getsockname()[1]}/hook"
    healthy: list[float] = []
    broken: list[float] = []
    block = max(1, args.drops // ROUNDS)
    try:  # alternating blocks, so drift in the machine's load hits both configurations
        with SandboxForge(port=0) as forge:
            for _ in range(ROUNDS):
                healthy += measure(forge, block, False, hanging_url)
                broken += measure(forge, block, True, hanging_url)
    finally:
        hanging.close()
    base, worse = percentile(healthy, 50) * 1000, percentile(broken, 50) * 1000
    result.add("healthy peers: B rename -> issues, p50", base, "ms", note="baseline")
    result.add("A broken (503 repo, hanging callback): same, p50", worse, "ms")
    result.add(
        "A broken (503 repo, hanging callback): same, p95", percentile(broken, 95) * 1000, "ms"
    )
    ratio = worse / base
    result.add("broken / healthy (p50)", ratio, "x", f"<= {TARGET_RATIO}", ratio <= TARGET_RATIO)
    result.info["setup"] = (
        f"{block * ROUNDS} drops of {TASKS}-task batches by B per configuration, in "
        f"{ROUNDS} alternating blocks (each with a fresh service and one warm-up drop); "
        f"A: {STUCK_DELIVERIES} finished batches with a never-answering callback and "
        f"{RUNNING} running {TASKS}-task batches, every request to A's repos answered 503; "
        "one repo per batch; poll interval 0.5 s; Service.run in a thread; in-process "
        "SandboxForge"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
