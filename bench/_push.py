"""Latency on a slow forge (40 ms per request): results by push, and drop -> receipt.

Used by `bench/latency.py` (and `bench/push.py`, which runs this part alone).

1. Results by push: a real `Service` (30 s poll interval, settle 0) with its HTTP server,
   registered as the sandbox's user webhook; the lane closes one issue at a time (comment,
   label, close); the clock runs from the close until the task's result is stored. The
   baseline is the same with webhooks off: the next poll cycle (half the interval on
   average) - computed, not waited for.
2. Drop -> receipt of a 10-task batch renamed into the inbox, against the floor the issue
   sets: 2 x one request's round trip (repo + label) + the time a bare client needs to
   create 10 issues at `SAAS_EVAL_INTAKE_CONCURRENCY` (median of 3, measured in the same
   run against the same forge process).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _common import (
    BenchResult,
    make_tasks,
    percentile,
    settings_for,
)
from _forge import ForgeProcess

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.forge.client import GiteaClient
from dropbox_eval.models import TaskStatus
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.service import Service
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api

POLL_INTERVAL = 30.0


def wait(predicate: object, limit: float = 30.0) -> float:
    """Seconds until `predicate()` holds (polled every 2 ms)."""
    start = time.perf_counter()
    while not predicate():  # type: ignore[operator]
        if time.perf_counter() - start > limit:
            raise RuntimeError("timed out")
        time.sleep(0.002)
    return time.perf_counter() - start


def running_service(app: App) -> tuple[Service, threading.Thread, BackgroundServer]:
    """The service with its HTTP server, registered as a webhook."""
    server = BackgroundServer(create_api(app.web), name="bench-http")
    app.settings.forge_webhook_url = f"{server.start()}/hooks/forge"
    service = service_for(app)
    thread = threading.Thread(target=service.run, name="bench-service", daemon=True)
    thread.start()
    return service, thread, server


def push_latency(forge: SandboxForge, closes: int) -> list[float]:
    """Lane close -> result stored, one issue at a time."""
    with tempfile.TemporaryDirectory(prefix="bench-push-") as home:
        settings = settings_for(
            home,
            forge.url,
            forge.token,
            forge.user,
            poll_interval=POLL_INTERVAL,
            settle_seconds=0,
            forge_webhook_secret="bench-secret",
        )
        app = build_app(settings)
        app.billing.add_client("bench", 0)
        service, thread, server = running_service(app)
        try:
            batch_id = app.intake.submit_batch("bench", make_tasks(closes + 1))["batch_id"]
            wait(lambda: bool(forge.state.hooks.listed(f"owner:{forge.user}")))
            service.poll_cycle()
            repo = app.store.get_batch(batch_id).repo.split("/", 1)[1]
            tasks = app.store.get_tasks(batch_id)
            samples = []
            for index, task in enumerate(tasks[:closes]):
                forge.finish_issue(
                    forge.user, repo, task.issue_number or 0, comment="ok", labels=["eval-pass"]
                )
                samples.append(
                    wait(
                        lambda i=index: app.store.get_tasks(batch_id)[i].status == TaskStatus.PASSED
                    )
                )
            return samples
        finally:
            service.stop()
            thread.join(timeout=30)
            server.stop()


def drop_latency(forge: SandboxForge, drops: int) -> list[float]:
    """Rename of a 10-task batch into the inbox -> its receipt written."""
    with tempfile.TemporaryDirectory(prefix="bench-drop-") as home:
        settings = settings_for(home, forge.url, forge.token, forge.user, poll_interval=3600)
        app = build_app(settings)
        app.billing.add_client("bench", 0)
        folder = settings.inbox_path / "bench"
        folder.mkdir(parents=True)
        service, thread, server = running_service(app)
        samples = []
        try:
            time.sleep(1.0)
            for index in range(drops + 1):
                part = folder / f"d{index}.json.part"
                part.write_text(json.dumps({"batch_ref": f"d{index}", "tasks": make_tasks(10)}))
                start = time.perf_counter()
                os.rename(part, folder / f"d{index}.json")
                receipt = folder / "accepted" / f"d{index}.json.receipt.json"
                wait(receipt.exists)
                took = time.perf_counter() - start
                if index:  # the first drop pays the token's login once
                    samples.append(took)
        finally:
            service.stop()
            thread.join(timeout=30)
            server.stop()
    return samples


def floor(forge: SandboxForge, concurrency: int) -> tuple[float, float]:
    """(one round trip, creating 10 issues at `concurrency`) on this forge, in seconds."""
    client = GiteaClient(forge.url, forge.token)
    client.prepare_repo(
        f"{forge.user}/floor-{time.monotonic_ns()}", "eval-task", "aaaaaa", new=True
    )
    trips = []
    for _ in range(5):
        start = time.perf_counter()
        client.version()
        trips.append(time.perf_counter() - start)
    creations = []
    for _ in range(3):
        repo = f"{forge.user}/floor-{time.monotonic_ns()}"
        label = client.prepare_repo(repo, "eval-task", "aaaaaa", new=True)
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            titles = [f"t{n}" for n in range(10)]
            list(pool.map(client.create_issue, [repo] * 10, titles, ["b"] * 10, [[label]] * 10))
        creations.append(time.perf_counter() - start)
    return statistics.median(trips), statistics.median(creations)


def push_figures(result: BenchResult, closes: int, drops: int, delay: float) -> None:
    """Both figures, each against its baseline."""
    with SandboxForge(port=0) as forge:
        forge.set_delay(delay)
        pushed = push_latency(forge, closes)
    with ForgeProcess(delay=delay) as remote:  # its own process: the forge's work apart
        dropped = drop_latency(remote, drops)  # type: ignore[arg-type]
        trip, create = floor(remote, 4)  # type: ignore[arg-type]
    p50 = percentile(pushed, 50)
    result.add(
        "lane closes an issue -> result stored, webhooks on: p50",
        p50 * 1000,
        "ms",
        "<= 1000 ms",
        p50 <= 1.0,
        note=f"p95 {percentile(pushed, 95) * 1000:.0f} ms",
    )
    result.add(
        "the same by polling alone (half the 30 s interval, computed)",
        POLL_INTERVAL / 2 * 1000,
        "ms",
        note="baseline",
    )
    limit = 2 * trip + create
    drop = percentile(dropped, 50)
    result.add(
        "drop -> receipt, 10-task batch: p50",
        drop * 1000,
        "ms",
        f"<= {limit * 1000:.0f} ms",
        drop <= limit,
        note=f"floor: 2 x {trip * 1000:.0f} ms round trip + {create * 1000:.0f} ms to "
        "create 10 issues at concurrency 4",
    )
    result.info["push setup"] = (
        f"sandbox forge answering every request after {delay * 1000:.0f} ms (in-process "
        "for the push figure, its own process for the drop and its floor); one repo per "
        "batch; Service.run in a thread with its HTTP server as the user webhook"
    )
