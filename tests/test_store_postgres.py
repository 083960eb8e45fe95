"""What the PostgreSQL engine adds to the store contract (test_store_contract.py runs the
contract itself on it): the ledger's unique key makes a second charge impossible, even
from two processes at once; the schema is migrated once, under its lock, and refused when
newer than the code; the setting chooses the engine; errors name the database, never its
password. On the session's private cluster (pgcluster.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from conftest import wait_for
from helpers import closed_port, ledger_entry
from pgcluster import Cluster, funded_store

from dropbox_eval.cli import main
from dropbox_eval.config import Settings
from dropbox_eval.errors import NoState, NotFoundError, StoreError
from dropbox_eval.models import BatchRecord, TaskRecord, TaskResult, TaskSpec, utcnow
from dropbox_eval.sftp.keys import KeyStore
from dropbox_eval.sftp.reports import Owners
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.pg.connection import POOL_MAX
from dropbox_eval.store.pg.engine import PostgresStore
from dropbox_eval.store.pg.migrate import latest_version, migrate, migrations
from dropbox_eval.store.statefolder import open_store


@pytest.fixture
def url(pg_cluster: Cluster) -> str:
    return pg_cluster.fresh_url()


@pytest.fixture
def store(url: str, tmp_path: Path) -> Iterator[PostgresStore]:
    with funded_store(url, tmp_path / "state") as made:
        yield made


def _batch() -> BatchRecord:
    return BatchRecord(
        batch_id="20250101T000000Z-abc123", client_id="acme", repo="a/b", total=1,
        created_at=utcnow(),
    )  # fmt: skip


def test_a_batch_is_charged_once_whoever_settles_it(store: PostgresStore, url: str) -> None:
    batch = _batch()
    with store.transaction() as tx:
        tx.record_batch(batch, [], ledger_entry("hold", 0, 3, batch.batch_id))
    other = PostgresStore(url, store.state_dir)  # another process's pool
    settlement = [
        ledger_entry("charge", -2, 0, batch.batch_id),
        ledger_entry("release", 0, -3, batch.batch_id),
    ]
    answers: list[bool] = []
    threads = [
        threading.Thread(target=lambda s=s: answers.append(s.settle(settlement)))
        for s in (store, other, store, other)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    other.close()
    assert sorted(answers) == [False, False, False, True]
    client = store.get_client("acme")
    assert client is not None and (client.balance, client.held) == (8, 0)
    with pytest.raises(StoreError, match="ledger_once_per_batch"), store.transaction() as tx:
        tx.post_ledger(ledger_entry("charge", -2, 0, batch.batch_id))  # past settle(): refused too
    assert [e.kind for e in store.ledger("acme")] == ["fund", "hold", "charge", "release"]


def test_the_schema_is_migrated_once_and_a_newer_one_is_refused(url: str) -> None:
    assert migrate(url) == []  # the template was migrated: nothing left
    with psycopg.connect(url, autocommit=True) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
        assert versions == [(m.version,) for m in migrations()]  # each once
        assert versions[-1] == (latest_version(),)
        conn.execute("INSERT INTO schema_migrations VALUES (9999, 'future', now())")
    with pytest.raises(StoreError, match="newer than this version"):
        migrate(url)


def test_an_empty_database_is_migrated_at_start_and_not_by_a_reader(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    empty = pg_cluster.fresh_url(migrated=False)
    with pytest.raises(NoState, match="dropbox-eval migrate"):
        PostgresStore(empty, tmp_path, read_only=True)
    result = CliRunner().invoke(main, ["migrate"], env={"SAAS_EVAL_DATABASE_URL": empty})
    assert result.exit_code == 0 and "applied 0001_init" in result.output
    again = CliRunner().invoke(main, ["migrate"], env={"SAAS_EVAL_DATABASE_URL": empty})
    assert "up to date" in again.output
    PostgresStore(empty, tmp_path, read_only=True).close()  # now readable


def test_the_setting_chooses_the_engine(url: str, tmp_path: Path) -> None:
    assert Settings(database_url="").database_url is None
    with pytest.raises(ValueError, match="postgresql://"):
        Settings(database_url="mysql://x/y")
    chosen = open_store(tmp_path / "pg", database_url=url)
    assert isinstance(chosen, PostgresStore)
    chosen.close()
    assert isinstance(open_store(tmp_path / "files"), TinyDBStore)


def test_an_unreachable_database_is_named_without_its_password(tmp_path: Path) -> None:
    url = f"postgresql://who:s3cret@127.0.0.1:{closed_port()}/nowhere"
    with pytest.raises(StoreError) as caught:
        PostgresStore(url, tmp_path)
    assert "nowhere on 127.0.0.1" in str(caught.value) and "s3cret" not in str(caught.value)


def test_sftp_reads_its_clients_and_batches_from_the_database(
    store: PostgresStore, url: str, tmp_path: Path
) -> None:
    # The endpoint's own files are in a folder of its own: no TinyDB state is there, so an
    # SFTP part that read the folder, not the database, would refuse every login.
    batch = _batch()
    with store.transaction() as tx:
        tx.record_batch(batch, [], ledger_entry("hold", 0, 1, batch.batch_id))
    node = tmp_path / "sftp-node"
    node.mkdir()
    keys = KeyStore(node, url)
    assert keys.refusal("acme") is None
    keys.close()
    assert "cannot read your account" in (KeyStore(node).refusal("acme") or "")
    owners = Owners(node, url)
    assert owners.owns("acme", batch.batch_id)
    assert owners.batch_ids("acme") == [batch.batch_id]
    owners.close()
    with store.transaction() as tx:
        tx.update_client("acme", disabled_at=utcnow().isoformat())
    keys = KeyStore(node, url)
    assert "client_disabled" in (keys.refusal("acme") or "")
    keys.close()


def _one_task_batch(store: PostgresStore) -> BatchRecord:
    """A batch recorded with its one task `t1` and its hold."""
    batch = _batch()
    spec = TaskSpec(task_id="t1", title="one")
    task = TaskRecord(
        task_id="t1", batch_id=batch.batch_id, repo="a/b", payload=spec, created_at=utcnow()
    )
    with store.transaction() as tx:
        tx.record_batch(batch, [task], ledger_entry("hold", 0, 1, batch.batch_id))
    return batch


def test_a_nul_byte_is_never_a_database_error(store: PostgresStore) -> None:
    """PostgreSQL holds no NUL in text or jsonb: a name holding one (hostile input) is
    unknown, and a NUL in what is kept (a lane's comment) is kept as U+FFFD, not refused;
    text that only looks like the escape stays as it is."""
    batch = _one_task_batch(store)
    said = "ok\x00done \\u0000 \\\x00"
    store.update_tasks(batch.batch_id, {"t1": {"result": TaskResult(summary=said)}})
    kept = store.get_tasks(batch.batch_id)[0].result
    assert kept is not None and kept.summary == said.replace("\x00", "\ufffd")
    with pytest.raises(NotFoundError):
        store.get_batch("a\x00b")


def test_a_crowd_waiting_for_the_store_lock_never_starves_its_holder(
    store: PostgresStore, url: str
) -> None:
    """More transactions wait for the store lock than the pool has connections (a flood
    of API posts each noting its key's use): the holder's own reads still get one."""
    waiters = POOL_MAX + 4
    holding, done = threading.Event(), threading.Event()
    errors: list[Exception] = []

    def wait_for_the_lock() -> None:
        holding.wait()
        try:
            with store.transaction():
                pass
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    crowd = [threading.Thread(target=wait_for_the_lock) for _ in range(waiters)]
    for thread in crowd:
        thread.start()
    with psycopg.connect(url, autocommit=True) as watch, store.transaction():
        holding.set()

        def waiting() -> int:
            row = watch.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            return int(row[0]) if row else 0

        assert wait_for(lambda: waiting() >= POOL_MAX - 1)  # the pool, but the holder, waits
        assert store.get_client("acme") is not None  # the holder's read is not starved
        done.set()
    for thread in crowd:
        thread.join()
    assert errors == []


def test_a_lane_result_orjson_refuses_is_kept_with_its_long_integer_exact(
    store: PostgresStore,
) -> None:
    """A lane's ```json block may hold an integer past 64 bits or a lone surrogate: the
    integer is kept digit for digit, the surrogate (which jsonb cannot hold) as U+FFFD."""
    batch = _one_task_batch(store)
    details = {"n": 123456789012345678901234567890, "s": "a\ud800b", "pair": "\U0001f600"}
    store.update_tasks(
        batch.batch_id, {"t1": {"result": TaskResult(summary="\ud800", details=details)}}
    )
    kept = store.get_tasks(batch.batch_id)[0].result
    assert kept is not None and kept.summary == "\ufffd"
    assert kept.details == {
        "n": 123456789012345678901234567890,
        "s": "a\ufffdb",
        "pair": "\U0001f600",
    }
