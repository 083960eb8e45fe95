"""A private PostgreSQL cluster for the tests: `initdb` and `pg_ctl` in a temp folder, on a
free loopback port, started once per test session (per xdist worker), each test given a
schema of its own in one database (`fresh_url`: 0.1 s, where a database from a template
takes 1 s). Advisory locks are per database: the tests of one worker run one at a time.

Debian's server binaries are required: a missing PostgreSQL fails the tests that need it
(never skips them), so CI cannot pass without running them (.ci/run installs it). As root
(CI), the server runs as the `postgres` user: initdb refuses root.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from dropbox_eval.store.pg.engine import PostgresStore
from dropbox_eval.store.pg.migrate import migrate

DATABASE = "dbe"
PREFIX = "dbe-pg-"
SERVER_OPTIONS = (  # a test cluster: durability off (never measure performance on it)
    "-c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
    " -c full_page_writes=off -c max_connections=200 -c shared_buffers=16MB"
)


def binaries() -> Path:
    """The folder of initdb and pg_ctl: Debian's newest, or the PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, pg_ctl) are missing: "
        "`apt-get install postgresql` (.ci/run does)"
    )


def _version(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


@dataclass
class Cluster:
    """A running private cluster."""

    folder: Path
    port: int
    options: str = SERVER_OPTIONS
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def url(self, dbname: str) -> str:
        """The URL of one of its databases."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        """Stop the server as an operator's fast shutdown does: every session is ended."""
        data = self.folder / "data"
        _run(_server_user(), binaries() / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")

    def start(self) -> None:
        """Start the stopped server again on the same port; back once this returns."""
        _start(_server_user(), binaries(), self.folder, self.port, self.options)

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every session is ended; back once this returns."""
        how = ("-m", "fast", "restart")
        _start(_server_user(), binaries(), self.folder, self.port, self.options, *how)

    def fresh_url(self, *, migrated: bool = True) -> str:
        """The URL of a new, empty schema (migrated, unless not `migrated`)."""
        schema = f"t{next(self._numbers)}"
        with psycopg.connect(self.url(DATABASE), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        url = f"{self.url(DATABASE)}?options=-csearch_path%3D{schema}"
        if migrated:
            migrate(url)
        return url


@contextlib.contextmanager
def running(options: str = SERVER_OPTIONS) -> Iterator[Cluster]:
    """Start a cluster with an empty database, the server run with `options`; stop and
    remove it after."""
    bin_dir = binaries()
    as_user = _server_user()
    _stop_orphans(bin_dir, as_user)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))  # under /tmp: the server user reaches it
    (folder / "owner.pid").write_text(str(os.getpid()))
    if as_user is not None:
        shutil.chown(folder, as_user, as_user)
    data, port = folder / "data", _free_port()
    _run(as_user, bin_dir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8")
    _start(as_user, bin_dir, folder, port, options)
    try:
        cluster = Cluster(folder, port, options)
        with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        yield cluster
    finally:
        _run(as_user, bin_dir / "pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def _start(
    as_user: str | None, bin_dir: Path, folder: Path, port: int, options: str, *how: str
) -> None:
    """`pg_ctl start` (or `how`: `-m fast restart`), waiting until the server answers."""
    options = f"-p {port} -k {folder} {options}"
    data, log = folder / "data", folder / "log"
    command = how or ("start",)
    _run(as_user, bin_dir / "pg_ctl", "-D", data, "-w", "-l", log, "-o", options, *command)


def _stop_orphans(bin_dir: Path, as_user: str | None) -> None:
    """Clusters whose test process died without stopping them (a killed run): stopped and
    removed, so that runs do not pile servers up."""
    for owner in Path(tempfile.gettempdir()).glob(f"{PREFIX}*/owner.pid"):
        try:
            os.kill(int(owner.read_text()), 0)
            continue  # its session is still running
        except ProcessLookupError:
            pass
        except (ValueError, OSError):
            continue
        data = owner.parent / "data"
        with contextlib.suppress(RuntimeError):
            _run(as_user, bin_dir / "pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(owner.parent, ignore_errors=True)


def _server_user() -> str | None:
    """Who runs the server: `postgres` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError("running as root needs a `postgres` user to run the server") from None
    return "postgres"


def _run(as_user: str | None, *argv: object) -> None:
    command = [str(arg) for arg in argv]
    if as_user is not None:
        command = ["runuser", "-u", as_user, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def funded_store(url: str, state_dir: Path) -> Iterator[PostgresStore]:
    """A store on `url` with client `acme` funded with 10 credits; closed after."""
    from helpers import ledger_entry

    from dropbox_eval.models import Client, utcnow

    made = PostgresStore(url, state_dir)
    with made.transaction() as tx:
        tx.add_client(Client(client_id="acme", created_at=utcnow()))
        tx.post_ledger(ledger_entry("fund", 10))
    try:
        yield made
    finally:
        made.close()
