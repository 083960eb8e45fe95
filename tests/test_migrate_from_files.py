"""`dropbox-eval migrate --from-files`: a TinyDB state made by the real flow (clients added,
funded, given keys and disabled on the command line, one key revoked, batches run on the
sandbox forge: delivered and archived, running, cancelled with its report, deleted to a
tombstone) moves into an empty PostgreSQL database whole. Every command reads the same
from both (batches, clients with their ledgers, each batch, the audit log), each report
is the same bytes, the comparison of the two stores finds nothing and the database's
state check neither. A database holding anything is refused and left as it was; a copy
that fails half-way leaves the database empty; a folder a service runs on, or one whose
own check finds a problem, is refused.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import Result
from conftest import Cli, isolated_cli, tasks
from filelock import FileLock
from helpers import finish_issues
from pgcluster import Cluster

from dropbox_eval.app import App, service_for
from dropbox_eval.ops.storecompare import compare_stores
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.store.engine import TinyDBStore
from dropbox_eval.store.pg.engine import PostgresStore

pytestmark = pytest.mark.tinydb_files  # the source is a TinyDB folder (the target: its own schema)

TABLES = ("clients", "batches", "tasks", "ledger", "audit_log")


@dataclass
class Folder:
    """A state folder made by the real flow, and the ids of what is in it."""

    cli: Cli
    state: Path
    delivered: str
    deleted: str
    running: str
    cancelled: str
    revoked: str


@pytest.fixture
def folder(
    app: App, forge: SandboxForge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Folder:
    cli = isolated_cli(tmp_path, forge, monkeypatch)  # the app's home: the same state
    for client, credits in (("acme", "100"), ("beta", "50")):
        _ok(cli("clients", "add", client, "--credits", credits))
    _ok(cli("clients", "fund", "beta", "7"))
    for _ in range(2):
        _ok(cli("clients", "api-key", "acme", "--json"))
    revoked = json.loads(_ok(cli("clients", "keys", "acme", "--json")).stdout)[0]["key_id"]
    _ok(cli("clients", "revoke-key", "acme", revoked))
    key = tmp_path / "client_key"  # an SFTP key, and the endpoint's host key, in files
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    _ok(cli("clients", "add-key", "acme", str(key.with_suffix(".pub"))))
    _ok(cli("sftp", "--known-hosts-line"))

    delivered = app.intake.submit_batch("acme", tasks(2), batch_ref="first")["batch_id"]
    deleted = app.intake.submit_batch("beta", tasks(1))["batch_id"]
    for batch_id, verdict in ((delivered, "eval-pass"), (deleted, "eval-fail")):
        finish_issues(forge, app.store.get_batch(batch_id).repo, verdict)
    service_for(app).run(once=True)  # both ended, reported, emitted and archived
    later = app.intake.submit_batch("beta", tasks(1))["batch_id"]
    finish_issues(forge, app.store.get_batch(later).repo, "eval-pass")
    service_for(app).run(once=True)  # archived after them: the history's order
    running = app.intake.submit_batch("acme", tasks(1), batch_ref="second")["batch_id"]
    cancelled = app.intake.submit_batch("beta", tasks(2))["batch_id"]
    app.lifecycle.cancel(cancelled)  # ended, its report fixed, not delivered yet: live
    _ok(cli("delete", deleted))  # a tombstone in the history
    _ok(cli("clients", "disable", "beta"))  # its batches stay; new work is refused

    store = app.store
    assert {row.batch_id for row in store.list_batches(live_only=True)} == {running, cancelled}
    assert store.tombstone(deleted) is not None
    assert store.get_report(delivered) is not None and store.get_report(cancelled) is not None
    actions = [entry.action for entry in store.audit_entries()]
    assert "clients revoke-key" in actions and "delete" in actions
    state = tmp_path / "state"
    return Folder(cli, state, delivered, deleted, running, cancelled, revoked)


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _on(url: str) -> dict[str, str]:
    return {"SAAS_EVAL_DATABASE_URL": url}


def _reads(folder: Folder, env: dict[str, str] | None) -> dict[str, Any]:
    """What the commands print of the state, under `env` (the database's URL or none)."""
    cli = folder.cli
    shown: dict[str, Any] = {}
    commands = [
        ("batches", "--json"),
        ("batches", "--all", "--json"),
        ("batches", "--client", "beta", "--json"),
        ("clients", "show", "--json"),
        ("audit", "--all", "--json"),
    ]
    for client in ("acme", "beta"):
        commands += [("clients", "show", client, "--all", "--json")]
        commands += [("clients", "keys", client, "--json")]
    for batch_id in (folder.delivered, folder.deleted, folder.running, folder.cancelled):
        commands += [("batch", batch_id, "--json")]
    commands += [("sftp", "--known-hosts-line")]  # the host key the clients pinned
    for command in commands:
        result = cli(*command, env=env)
        if command[0] == "sftp":
            shown["sftp"] = (result.exit_code, result.stdout)
            continue
        shown[" ".join(command)] = (result.exit_code, json.loads(result.stdout))
    return shown


def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the store's tables, as the database holds them."""
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in TABLES
        }


def test_a_folder_moves_whole_and_both_stores_answer_the_same(
    folder: Folder, pg_cluster: Cluster
) -> None:
    url = pg_cluster.fresh_url(migrated=False)  # `migrate --from-files` creates the schema
    before = _reads(folder, None)
    assert before["clients show acme --all --json"][1]["balance"] < 100  # money moved

    moved = folder.cli("migrate", "--from-files", str(folder.state), "--json", env=_on(url))
    assert moved.exit_code == 0, moved.output
    answer = json.loads(moved.stdout)
    assert answer["ok"] is True and answer["differences"] == [] and answer["findings"] == []
    assert answer["applied"]  # the schema came first
    copied = answer["copied"]
    assert (copied["clients"], copied["live"], copied["archived"]) == (2, 2, 2)
    assert copied["buried"] == [folder.deleted] and copied["reports"] == 3

    assert _reads(folder, _on(url)) == before  # every command reads the same
    assert before["clients show beta --all --json"][1]["state"] == "disabled"
    files = TinyDBStore(folder.state, read_only=True)
    database = PostgresStore(url, folder.state, read_only=True)
    try:
        for batch_id in (folder.delivered, folder.deleted, folder.running, folder.cancelled):
            assert database.get_report(batch_id) == files.get_report(batch_id)
        for client in ("acme", "beta"):  # the same entries: ids, order, balances after
            assert database.ledger(client) == files.ledger(client)
            found = database.get_client(client)
            assert found is not None and found == files.get_client(client)
        assert compare_stores(files, database) == []
        assert database.tombstone(folder.deleted) == files.tombstone(folder.deleted)
        acme = database.get_client("acme")
        assert acme is not None and folder.revoked not in {k.key_id for k in acme.api_keys}
    finally:
        database.close()
    check = folder.cli("check", "--json", env=_on(url))
    assert json.loads(check.stdout)["findings"] == []

    kept = _rows(url)
    again = folder.cli("migrate", "--from-files", str(folder.state), env=_on(url))
    assert again.exit_code == 1
    assert "already holds data (2 clients" in again.output and "nothing was copied" in again.output
    assert _rows(url) == kept  # not one row more, less or changed
    as_json = folder.cli("migrate", "--from-files", str(folder.state), "--json", env=_on(url))
    refusal = json.loads(as_json.stdout)
    assert as_json.exit_code == 1 and refusal["reason"] == "database_not_empty"
    assert refusal["clients"] == 2 and refusal["batches"] == 5
    assert _reads(folder, None) == before  # and the folder is as it was


def test_the_comparison_names_what_differs(folder: Folder, pg_cluster: Cluster) -> None:
    url = pg_cluster.fresh_url()
    said = _ok(folder.cli("migrate", "--from-files", str(folder.state), env=_on(url))).output
    assert f"copied {folder.state}: 2 clients" in said and "1 deleted: tombstones" in said
    assert "they agree" in said and "state check of the database: consistent" in said
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE ledger SET note = 'edited' WHERE seq = 2")
        conn.execute(
            'UPDATE tasks SET doc = doc || \'{"status": "failed"}\' WHERE batch_id = %s',
            (folder.delivered,),
        )
        conn.execute("UPDATE batches SET report = 'x' WHERE batch_id = %s", (folder.cancelled,))
    files = TinyDBStore(folder.state, read_only=True)
    database = PostgresStore(url, folder.state, read_only=True)
    try:
        found = [d.line() for d in compare_stores(files, database, names=("files", "database"))]
    finally:
        database.close()
    assert any(
        "ledger entry #1: note:" in line and "'edited' in the database" in line for line in found
    ), found
    assert any(f"batch {folder.delivered}, task #1: status" in line for line in found), found
    assert any(f"batch {folder.cancelled}: report" in line for line in found), found


def test_a_copy_cut_short_leaves_the_database_empty(folder: Folder, pg_cluster: Cluster) -> None:
    url = pg_cluster.fresh_url()
    with psycopg.connect(url, autocommit=True) as conn:  # the last table copied fails
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'disk on fire'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON audit_log"
            " FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    failed = folder.cli("migrate", "--from-files", str(folder.state), env=_on(url))
    assert failed.exit_code == 1 and "disk on fire" in failed.output
    assert all(rows == [] for rows in _rows(url).values())  # nothing of the copy stayed


def test_a_folder_in_use_or_inconsistent_is_refused(folder: Folder, pg_cluster: Cluster) -> None:
    url = pg_cluster.fresh_url()
    with FileLock(str(folder.state / "service.lock")):  # as if a service ran on it
        busy = folder.cli("migrate", "--from-files", str(folder.state), env=_on(url))
    assert busy.exit_code == 5 and "another dropbox-eval run" in busy.output
    record = folder.state / "batches" / f"{folder.running}.json"
    row = json.loads(record.read_text())
    row["batch"]["1"]["done"] = 1  # the index row no longer agrees with the record
    record.write_text(json.dumps(row))
    refused = folder.cli("migrate", "--from-files", str(folder.state), "--json", env=_on(url))
    answer = json.loads(refused.stdout)
    assert refused.exit_code == 1 and answer["reason"] == "source_not_consistent"
    assert "check --repair" in answer["message"] and answer["findings"]
    assert all(rows == [] for rows in _rows(url).values())
    no_state = folder.cli("migrate", "--from-files", str(folder.state.parent), env=_on(url))
    assert no_state.exit_code == 2 and "no state folder" in no_state.output
