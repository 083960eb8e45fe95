"""The database restarts while the service runs (issue 33): the store's pool replaces the
connections the restart ended, a read or a whole transaction of the store's own that the
restart cut is run again, a COMMIT whose outcome is unknown is never run again blindly, a
write while the server is down fails (StoreError) instead of hanging, an issue claim lost
with its connection stops its holder, and the service, which takes a StoreError as "try
again later", ends every batch exactly once.

On a cluster of this module's own (pgcluster.py): restarting it stops no other test's
database."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from conftest import PATIENCE, Cli, serving, settings_on, tasks, wait_for
from helpers import drop, ledger_entry
from pgcluster import Cluster, funded_store, running

from dropbox_eval.app import build_app
from dropbox_eval.errors import StoreError
from dropbox_eval.models import BatchRecord, BatchStatus, LedgerEntry, utcnow
from dropbox_eval.sandbox import SandboxForge, SimulatedLane
from dropbox_eval.store.pg.claims import ClaimLost
from dropbox_eval.store.pg.connection import (
    LOCK_SPACE,
    POOL_TIMEOUT,
    STORE_LOCK,
    ConnectionLost,
    DatabaseError,
)
from dropbox_eval.store.pg.engine import PostgresStore

FUNDED = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running() as made:
        yield made


@pytest.fixture
def url(cluster: Cluster) -> str:
    return cluster.fresh_url()


@pytest.fixture
def store(url: str, tmp_path: Path) -> Iterator[PostgresStore]:
    with funded_store(url, tmp_path / "state") as made:
        yield made


def _batch(n: int = 0) -> BatchRecord:
    return BatchRecord(
        batch_id=f"20250101T00000{n}Z-abc123", client_id="acme", repo="a/b", total=1,
        created_at=utcnow(),
    )  # fmt: skip


def _record(store: PostgresStore, batch: BatchRecord) -> None:
    with store.transaction() as tx:
        tx.record_batch(batch, [], ledger_entry("hold", 0, 3, batch.batch_id))


def _settlement(batch: BatchRecord) -> list[LedgerEntry]:
    return [
        ledger_entry("charge", -2, 0, batch.batch_id),
        ledger_entry("release", 0, -3, batch.batch_id),
    ]


def _fill_pool(store: PostgresStore, connections: int = 4) -> None:
    """Several connections in the pool at once (a claim holds one), each of which the
    restart will end."""
    inside = threading.Barrier(connections, timeout=PATIENCE)

    def hold(n: int) -> None:
        with store.claim_issues(f"filling-{n}"):
            inside.wait()

    threads = [threading.Thread(target=hold, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_every_connection_checks_its_link_and_names_the_service(store: PostgresStore) -> None:
    """A link that died silently is found in seconds (keepalives, an unanswered-data
    timeout), and the sessions are the service's in pg_stat_activity."""
    with store._reading() as conn:
        params = conn.info.get_parameters()
        sessions = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'dropbox-eval'"
        ).fetchone()
    assert (params["keepalives"], params["keepalives_idle"]) == ("1", "10")
    assert params["tcp_user_timeout"] == "30000"
    assert sessions is not None and sessions["n"] >= 1


def test_a_store_outlives_a_restart_of_its_database(
    store: PostgresStore, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = _batch(1), _batch(2)
    _record(store, first)
    _fill_pool(store)
    cluster.restart()
    # every pooled connection died with the server: none is handed out broken, so no
    # operation meets a lost connection (none is run again)
    assert store.get_batch(first.batch_id).batch_id == first.batch_id
    assert store.settle(_settlement(first))
    _record(store, second)
    store.update_batch(second.batch_id, status=BatchStatus.FAILED)
    assert [row.batch_id for row in store.list_batches()] == [first.batch_id, second.batch_id]
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (8, 3)
    assert not _reruns(caplog)


def test_a_write_while_the_database_is_down_fails_then_works_once_it_is_back(
    store: PostgresStore, cluster: Cluster
) -> None:
    batch = _batch()
    _record(store, batch)
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            store.update_batch(batch.batch_id, status=BatchStatus.FAILED)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    cluster.stop()
    try:
        writer = threading.Thread(target=write)
        writer.start()
        writer.join(PATIENCE)  # bounded by the pool's timeout: it fails, never hangs
        assert not writer.is_alive()
    finally:
        cluster.start()
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome
    assert "dbe on 127.0.0.1" in str(outcome[0])
    assert store.get_batch(batch.batch_id).status == BatchStatus.RUNNING  # nothing landed
    store.update_batch(batch.batch_id, status=BatchStatus.FAILED)  # the same store, back
    assert store.get_batch(batch.batch_id).status == BatchStatus.FAILED


def test_a_transaction_cut_by_a_restart_before_its_commit_is_run_again_whole(
    store: PostgresStore, cluster: Cluster, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    batch = _batch()
    _record(store, batch)
    outcome: list[object] = []
    holder = psycopg.connect(url, autocommit=True)  # another node, in a transaction
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_SPACE, STORE_LOCK))
        settler = threading.Thread(target=lambda: outcome.append(store.settle(_settlement(batch))))
        settler.start()
        assert wait_for(lambda: _waiting_for_the_store_lock(holder))
        cluster.restart()  # ends the settle's transaction while it waits for the lock
    finally:
        holder.close()
    settler.join(PATIENCE)
    assert outcome == [True]  # run again on a new connection, once the server was back
    assert _reruns(caplog) == ["settle"]
    assert [e.kind for e in store.ledger("acme")] == ["fund", "hold", "charge", "release"]
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (8, 0)


def _reruns(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The store operations run again after a lost connection, as the log says."""
    said = [r.getMessage() for r in caplog.records if r.name == "dropbox_eval"]
    return [m.rsplit("; running ", 1)[1].removesuffix(" again") for m in said if "; running " in m]


def _waiting_for_the_store_lock(holder: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = holder.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ).fetchone()
    return row is not None and row[0] == 1


def test_a_whole_transaction_whose_connection_dies_inside_is_run_again_from_its_start(
    store: PostgresStore, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    batch = _batch()
    decisions: list[int] = []

    def decide() -> LedgerEntry:  # the first run's connection is killed under it
        decisions.append(1)
        if len(decisions) == 1:
            _terminate(url)
        return ledger_entry("hold", 0, 3, batch.batch_id)

    store.commit_new(batch, [], decide)
    assert len(decisions) == 2 and _reruns(caplog) == ["commit_new"]
    assert [e.kind for e in store.ledger("acme")] == ["fund", "hold"]
    assert store.get_batch(batch.batch_id).batch_id == batch.batch_id


def test_a_connection_lost_at_commit_is_not_taken_for_one_lost_before(
    store: PostgresStore, url: str
) -> None:
    batch = _batch()
    with pytest.raises(DatabaseError) as caught, store.transaction() as tx:
        tx.record_batch(batch, [], ledger_entry("hold", 0, 3, batch.batch_id))
        _terminate(url)  # the body is over: COMMIT is sent next
    assert not isinstance(caught.value, ConnectionLost)  # never run again blindly
    assert "may or may not have landed" in str(caught.value)
    assert not store.is_recorded(batch.batch_id)  # here it did not (the server said no)


def _terminate(url: str) -> None:
    """End the one server session in the middle of a transaction, as a restart would, and
    wait until it is gone."""
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND state = 'idle in transaction'"
        ).fetchall()
        assert len(ended) == 1, ended
        pid = ended[0][1]
        assert wait_for(
            lambda: (
                admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                is None
            )
        )


def test_an_issue_claim_lost_with_its_connection_stops_its_holder(
    store: PostgresStore, cluster: Cluster, url: str, tmp_path: Path
) -> None:
    batch = _batch()
    _record(store, batch)
    other = PostgresStore(url, tmp_path / "other")  # another node
    try:
        with pytest.raises(ClaimLost), store.claim_issues(batch.batch_id) as mine:
            assert mine
            with other.claim_issues(batch.batch_id) as theirs:
                assert not theirs  # held: nobody else may open its issues
            cluster.restart()  # the claim's session ends with the server
            with other.claim_issues(batch.batch_id) as theirs:
                assert theirs  # so another node may take it now
            store.update_batch(batch.batch_id, open_started=True)  # the holder's next write
        assert not store.get_batch(batch.batch_id).open_started  # refused: it stopped there
        with pytest.raises(ClaimLost), store.claim_issues(batch.batch_id) as mine:
            assert mine
            cluster.restart()  # a holder that writes nothing more hears it at the end
        with store.claim_issues(batch.batch_id) as mine:
            assert mine  # a new claim works
    finally:
        other.close()


# -- the service --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_service_ends_every_batch_once_across_database_restarts(
    cluster: Cluster, url: str, tmp_path: Path, forge: SandboxForge
) -> None:
    settings = settings_on(
        forge,
        tmp_path,
        database_url=url,
        quiet_period=0.1,
        poll_interval=0.2,
        settle_seconds=0,
        task_price=1,
        retry_base=0.2,
        retry_cap=2.0,
        rescan_interval=1.0,  # a drop left in place is looked at again soon
    )
    app = build_app(settings)
    app.billing.add_client("acme", FUNDED)
    inbox = settings.inbox_path
    lane = SimulatedLane(forge.state, delay=0.0, interval=0.05)
    lane.start()
    dropped: list[str] = []

    def wave(name: str, count: int) -> None:
        for i in range(count):
            file = f"{name}-{i}.json"
            drop(inbox, file, {"batch_ref": f"{name}-{i}", "tasks": tasks(3)}, "acme")
            dropped.append(file)

    accepted = inbox / "acme" / "accepted"
    try:
        with serving(app) as service:
            wave("before", 6)
            assert wait_for(lambda: any(accepted.glob("*.receipt.json")))
            cluster.restart()  # mid-run: drops, openings, polls and deliveries in flight
            wave("after", 6)
            cluster.stop()
            try:
                wave("down", 4)  # they wait in the inbox for the database
                # down for longer than two of the pool's timeouts, as the service's own
                # errors date it: each part has failed on the database at least once
                failing: list[datetime] = []
                assert wait_for(lambda: _failing_for(failing, service.status.get("last_error")))
            finally:
                cluster.start()
            wave("back", 4)
            assert wait_for(lambda: _delivered(settings.outbox_path) == len(dropped), 3 * PATIENCE)
    finally:
        lane.stop()
    receipts = sorted(accepted.glob("*.receipt.json"))
    assert sorted(r.name.removesuffix(".receipt.json") for r in receipts) == sorted(dropped)
    assert not (inbox / "acme" / "rejected").exists()
    assert not list((inbox / "acme").glob("*.json"))  # none left in place
    batch_ids = {json.loads(r.read_text())["batch_id"] for r in receipts}
    rows = app.store.list_batches()
    assert len(batch_ids) == len(rows) == len(dropped)  # one batch per drop
    assert {row.batch_id for row in rows} == batch_ids
    assert {row.status for row in rows} == {BatchStatus.EMITTED}
    for batch_id in batch_ids:
        report = json.loads((settings.outbox_path / f"{batch_id}.json").read_text())
        assert report["counts"] == {"total": 3, "passed": 3, "failed": 0}, report
    ledger = app.store.ledger("acme")
    for kind in ("hold", "charge", "release"):  # each once per batch, never twice
        of_kind = [e.batch_id for e in ledger if e.kind == kind]
        assert sorted(of_kind) == sorted(batch_ids), kind
    charged = -sum(e.amount for e in ledger if e.kind == "charge")
    assert charged == 3 * len(dropped)
    client = app.billing.client("acme")
    assert (client.balance, client.held) == (FUNDED - charged, 0)
    app.store.close()
    checked = Cli(tmp_path, forge)("check", "--json", env={"SAAS_EVAL_DATABASE_URL": url})
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.stdout)["findings"] == []


def _failing_for(failing: list[datetime], last_error: object) -> bool:
    """Whether the service's errors for want of a database connection (`failing`: the
    times of those seen so far) span more than two of the pool's timeouts."""
    said = str(last_error)
    if "no database connection" in said:
        failing.append(datetime.fromisoformat(said.split()[0]))
    return bool(failing) and (failing[-1] - failing[0]).total_seconds() > 2 * POOL_TIMEOUT


def _delivered(outbox: Path) -> int:
    return len(list(outbox.glob("*.json")))
