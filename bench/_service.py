"""The product running as a service for the flow benches: its default settings against a
forge, funded clients with inbox folders, drops renamed into place, waits that poll, and
the forge budget sampled over time.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dropbox_eval.app import App, build_app, service_for
from dropbox_eval.config import Settings, load_settings
from dropbox_eval.forge.scheduler import ForgeScheduler
from dropbox_eval.service import Service
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api

FUNDS = 10**7  # credits per client: more than any bench spends at the default price
WAIT_LIMIT = 120.0


class Forge(Protocol):
    """What the product needs of a forge: an in-process SandboxForge or a ForgeProcess."""

    url: str
    token: str
    user: str

    def fail_for(self, seconds: float, status: int = 503) -> None:
        """Every API request answers `status` for the next `seconds`."""


def product_settings(home: str, forge: Forge, **extra: Any) -> Settings:
    """The product's default settings against `forge`; `extra` names every change."""
    return load_settings(
        home=home, gitea_url=forge.url, gitea_token=forge.token, owner=forge.user, **extra
    )


def wait_until(
    predicate: Callable[[], object], limit: float = WAIT_LIMIT, pause: float = 0.005
) -> float:
    """Seconds until `predicate()` holds, polled every `pause` s; RuntimeError after `limit`."""
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > limit:
            raise RuntimeError(f"condition not met within {limit:.0f} s")
        time.sleep(pause)
    return time.perf_counter() - start


def write_part(folder: Path, name: str, document: dict[str, Any]) -> Path:
    """`name.part` written and fsynced in `folder` (not a candidate name yet)."""
    part = folder / f"{name}.part"
    with open(part, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(document))
        handle.flush()
        os.fsync(handle.fileno())
    return part


def rename_in(part: Path) -> float:
    """Rename `X.part` to `X` (an atomic upload); the moment of the rename."""
    start = time.perf_counter()
    os.rename(part, part.with_suffix(""))
    return start


def drop(folder: Path, name: str, document: dict[str, Any]) -> float:
    """Write `name.part`, fsync, rename into place; returns the moment of the rename."""
    return rename_in(write_part(folder, name, document))


def created(entries: Iterable[dict[str, Any]]) -> int:
    """Issues created (POST .../issues answered 201) in a request log."""
    return sum(
        1
        for e in entries
        if e["method"] == "POST" and e["path"].endswith("/issues") and e["status"] == 201
    )


@dataclass
class Running:
    """A running service: its app, and where its clients drop and find their receipts."""

    product: App
    service: Service | None = None

    @property
    def scheduler(self) -> ForgeScheduler:
        """The fair gate in front of the forge (its limiter holds the budget)."""
        gitea = self.product.gitea
        assert gitea is not None and gitea.scheduler is not None
        return gitea.scheduler

    def inbox(self, client: str) -> Path:
        """The client's inbox folder."""
        return self.product.settings.inbox_path / client

    def receipt(self, client: str, name: str) -> dict[str, Any] | None:
        """The receipt of the drop `name`, once written."""
        path = self.inbox(client) / "accepted" / f"{name}.receipt.json"
        try:
            found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return found

    def batch_id(self, client: str, name: str, limit: float = WAIT_LIMIT) -> str:
        """The batch id of the drop `name`, waiting for its receipt."""
        wait_until(lambda: self.receipt(client, name), limit, 0.005)
        found = self.receipt(client, name)
        assert found is not None
        return str(found["batch_id"])

    def opened(self, batch_id: str) -> bool:
        """Whether every issue of the batch is created (and stored)."""
        return self.product.store.get_batch(batch_id).intake_done


@contextlib.contextmanager
def running(
    forge: Forge, clients: Iterable[str], *, webhook: bool = False, **settings: Any
) -> Iterator[Running]:
    """`Service.run` in a thread over a fresh home, clients funded and their inbox folders
    made; with `webhook`, its HTTP server registered as the forge's user webhook. At the
    end the forge fails every request until the service has stopped, so intakes in flight
    end at once rather than after their last issue (the forge's delay is kept)."""
    if webhook:
        settings.setdefault("forge_webhook_secret", "bench-secret")
    with tempfile.TemporaryDirectory(prefix="bench-service-") as home:
        run = Running(build_app(product_settings(home, forge, **settings)))
        for client in clients:
            run.product.billing.add_client(client, FUNDS)
            run.inbox(client).mkdir(parents=True)
        server = (
            BackgroundServer(create_api(run.product.web), name="bench-http") if webhook else None
        )
        if server is not None:
            run.product.settings.forge_webhook_url = f"{server.start()}/hooks/forge"
        service = run.service = service_for(run.product)
        thread = threading.Thread(target=service.run, name="bench-service", daemon=True)
        thread.start()
        try:
            wait_until(lambda: service.status.get("last_poll_at") is not None, 60, 0.01)
            yield run
        finally:
            forge.fail_for(3600)
            service.stop()
            thread.join(timeout=120)
            forge.fail_for(0)
            if server is not None:
                server.stop()


@dataclass
class Sample:
    """The forge budget at one moment."""

    at: float
    limit: int
    in_flight: int


@dataclass
class Budget:
    """The scheduler's budget (`limiter.limit`) and calls in flight, sampled over time."""

    start: float
    samples: list[Sample]

    def between(self, begin: float, end: float) -> list[Sample]:
        """The samples taken from `begin` to `end` seconds after the start."""
        return [s for s in self.samples if begin <= s.at < end]


@contextlib.contextmanager
def sampling(scheduler: ForgeScheduler, every: float = 0.1) -> Iterator[Budget]:
    """Sample the budget every `every` seconds in a thread while the block runs."""
    budget = Budget(time.perf_counter(), [])
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            at = time.perf_counter() - budget.start
            budget.samples.append(Sample(at, scheduler.limiter.limit, scheduler.in_flight))

    thread = threading.Thread(target=sample, name="budget-sampler", daemon=True)
    thread.start()
    try:
        yield budget
    finally:
        stop.set()
        thread.join()
