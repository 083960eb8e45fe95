"""A world for crash-point tests: a tmp home, the sandbox forge and a callback receiver in
this process, and `dropbox-eval run --once` passes in child processes that a crash point
(DROPBOX_EVAL_CRASH_AFTER) may kill; the invariants every run must end in. The store is the
state folder's TinyDB, or a PostgreSQL schema of its own when `database_url` is given."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import forkrun
from conftest import Receiver, settings_on, tasks
from helpers import finish_issues

from dropbox_eval.app import build_app, service_for
from dropbox_eval.billing.accounts import Billing
from dropbox_eval.config import load_settings
from dropbox_eval.models import BatchStatus
from dropbox_eval.ops.statecheck import StateCheck
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store import BatchRow
from dropbox_eval.store.contract import Store
from dropbox_eval.store.statefolder import open_store
from dropbox_eval.util.fileio import write_atomically

CREDITS = 50
TASKS = 3
PASS_TIMEOUT = 120.0  # generous: a loaded machine is slow, and a pass normally ends by itself
SETTINGS: dict[str, Any] = {
    "quiet_period": 0,
    "settle_seconds": 0,
    "task_price": 1,
    "delivery_retry_base": 0.01,
    "callback_allow": "127.0.0.1",
}
ENDED = {BatchStatus.EMITTED, BatchStatus.CANCELLED, BatchStatus.EXPIRED}


@dataclass
class World:
    """One client's state folder against one forge; `crash` arms the next passes."""

    home: Path
    forge: SandboxForge
    receiver: Receiver | None = None
    database_url: str | None = None  # the store on PostgreSQL; else TinyDB in the home
    drops: list[str] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)  # what each kill's crash point said
    _store: Store | None = None

    def __enter__(self) -> World:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._store is not None:
            self._store.close()

    @property
    def settings(self) -> Any:
        return load_settings(home=self.home)

    def store(self) -> Store:
        """The store as it is now: the files read afresh, or the database (one pool, closed
        with the world)."""
        if self.database_url is None:
            return open_store(self.settings.state_path)
        if self._store is None:
            self._store = open_store(self.settings.state_path, database_url=self.database_url)
        return self._store

    def env(self, crash: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
        env.pop("DROPBOX_EVAL_CRASH_AFTER", None)
        env.update(
            SAAS_EVAL_HOME=str(self.home),
            SAAS_EVAL_GITEA_URL=self.forge.url,
            SAAS_EVAL_GITEA_TOKEN=self.forge.token,
            SAAS_EVAL_OWNER=self.forge.user,
        )
        env.update({f"SAAS_EVAL_{k.upper()}": str(v) for k, v in SETTINGS.items()})
        if self.database_url is not None:
            env["SAAS_EVAL_DATABASE_URL"] = self.database_url
        if crash:
            env["DROPBOX_EVAL_CRASH_AFTER"] = crash
        return env

    def command(self, *args: str, crash: str | None = None) -> bool:
        """Run `dropbox-eval ARGS` in a child; True when a crash point killed it."""
        proc = forkrun.run(list(args), self.env(crash), PASS_TIMEOUT)
        if proc.returncode == -signal.SIGKILL:
            self.kills.append(proc.stderr.strip().splitlines()[-1])
            return True
        assert proc.returncode in (0, 1), proc.stderr[-3000:]
        return False

    def run_once(self, crash: str | None = None) -> bool:
        """One `run --once` pass; True when a crash point killed it. An armed pass runs in
        a child process (the kill must not take the tests with it); the others run here, as
        a service started afresh on the same state, which is what a restart is."""
        if crash is not None:
            return self.command("run", "--once", crash=crash)
        database = {} if self.database_url is None else {"database_url": self.database_url}
        app = build_app(settings_on(self.forge, self.home, **SETTINGS, **database))
        runner = threading.Thread(target=service_for(app).run, kwargs={"once": True}, daemon=True)
        runner.start()
        runner.join(PASS_TIMEOUT)
        assert not runner.is_alive(), "a run --once pass did not end"
        app.store.close()
        return False

    def fund(self) -> None:
        Billing(self.store(), 1).add_client("acme", CREDITS)

    def drop(self, callback: bool = False) -> None:
        name = f"b{len(self.drops) + 1}.json"
        document: dict[str, Any] = {"batch_ref": name[:-5], "tasks": tasks(TASKS)}
        if callback:
            assert self.receiver is not None
            document["callback_url"] = self.receiver.url
        write_atomically(self.settings.inbox_path / "acme" / name, json.dumps(document))
        self.drops.append(name)

    def drop_cancel(self) -> None:
        batch_id = self.batch().batch_id
        path = self.settings.inbox_path / "acme" / f"cancel-{batch_id}.json"
        if not (self.settings.inbox_path / "acme" / "accepted" / path.name).exists():
            write_atomically(path, "{}")

    def batch(self) -> BatchRow:
        (row,) = self.store().list_batches()
        return row

    def close_issues(self) -> None:
        """The lane: every open issue of the client's repos passes."""
        for repo in self.repos():
            finish_issues(self.forge, f"{self.forge.user}/{repo}")

    def expire_now(self) -> None:
        store = self.store()
        batch = self.batch()
        if batch.status == BatchStatus.RUNNING:
            store.update_batch(batch.batch_id, deadline=_past())

    def repos(self) -> list[str]:
        return sorted(n for _o, n in list(self.forge.state.repos) if n.startswith("eval-acme"))

    def ended(self) -> bool:
        rows = self.store().list_batches()
        return len(rows) == len(self.drops) and all(r.status in ENDED for r in rows)


Step = Callable[[World], None]


def play(world: World, steps: list[Step], crash: str | None, armed_from: int = 0) -> bool:
    """Each step, then a pass, armed with `crash` from step `armed_from` on until one
    kill; a killed pass is run again unarmed (the restart). Then passes until every batch
    ended. True if a crash point killed a pass."""
    killed = False
    for number, step in enumerate(steps):
        step(world)
        armed = crash if number >= armed_from and not killed else None
        if world.run_once(armed):
            killed = True
            world.run_once()
    for _ in range(4):
        if world.ended():
            break
        world.run_once()
    return killed


def assert_invariants(world: World, *, callback: bool = False) -> None:
    """What every run ends in, killed or not."""
    kills = world.kills
    store = world.store()
    client_folder = world.settings.inbox_path / "acme"
    accepted = client_folder / "accepted"
    for name in world.drops:
        assert (accepted / name).is_file(), (name, kills)
        assert (accepted / f"{name}.receipt.json").is_file(), (name, kills)
    receipts = sorted(p.name for p in accepted.glob("b*.receipt.json"))
    assert receipts == sorted(f"{n}.receipt.json" for n in world.drops), (receipts, kills)
    assert not list(client_folder.glob("*.json")), kills  # nothing left in the drop folder
    assert not (client_folder / "rejected").exists(), kills
    rows = store.list_batches()
    assert len(rows) == len(world.drops), (rows, kills)
    for row in rows:
        batch = store.get_batch(row.batch_id)
        assert batch.status in ENDED and batch.emitted_at is not None, (batch, kills)
        repo = batch.repo.split("/")[1]
        titles = [i["title"] for i in world.forge.issues(world.forge.user, repo)]
        assert sorted(titles) == sorted(t["title"] for t in tasks(TASKS)), (titles, kills)
        report = (store.get_report(row.batch_id) or b"").decode()
        if callback:
            assert world.receiver is not None
            delivered = [body.decode() for _h, body in world.receiver.received]
            assert report in delivered, kills
            ids = {h["webhook-id"] for h, _b in world.receiver.received}
            assert ids == {f"msg_{batch.batch_id}"}, kills
            assert not list((world.settings.outbox_path / "undelivered").glob("*.json")), kills
        else:
            out = world.settings.outbox_path / f"{batch.batch_id}.json"
            assert out.read_text(encoding="utf-8") == report, kills
    client = store.get_client("acme")
    assert client is not None
    charged = sum(store.get_batch(r.batch_id).charged or 0 for r in rows)
    assert (client.balance, client.held) == (CREDITS - charged, 0), (client, kills)
    ledger = store.ledger("acme")
    assert sum(e.amount for e in ledger) == client.balance, kills
    assert sum(e.held_change for e in ledger) == 0, kills
    check = StateCheck(store, Billing(store, 1), 8)
    assert check.run(repair=False) == [], kills


def _past() -> Any:
    from datetime import timedelta

    from dropbox_eval.models import utcnow

    return utcnow() - timedelta(seconds=1)
