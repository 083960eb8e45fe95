"""A private PostgreSQL cluster for the benches, durable as a production server is (fsync,
synchronous commits and full-page writes on), unlike the tests' cluster (durability off:
never measure on it). Its start-up and clean-up are the tests' (tests/pgcluster.py, imported
from there): a temp folder, a free loopback port, Debian's server binaries, run as `postgres`
when we are root.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

DURABLE_OPTIONS = (  # PostgreSQL's defaults for durability, said out loud
    "-c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on"
    " -c full_page_writes=on -c max_connections=200"
)


sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # not a package
import pgcluster  # noqa: E402
from pgcluster import Cluster as Cluster  # noqa: E402  (re-exported)


@contextlib.contextmanager
def durable_cluster() -> Iterator[Cluster]:
    """A running cluster with an empty database (`Cluster.fresh_url` gives a migrated
    schema of it); stopped and removed after."""
    bin_dir = pgcluster.binaries()
    as_user = pgcluster._server_user()
    pgcluster._stop_orphans(bin_dir, as_user)
    folder = Path(tempfile.mkdtemp(prefix=pgcluster.PREFIX))
    (folder / "owner.pid").write_text(str(os.getpid()))
    if as_user is not None:
        shutil.chown(folder, as_user, as_user)
    data, port = folder / "data", pgcluster._free_port()
    run = pgcluster._run
    run(as_user, bin_dir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8")
    options = f"-p {port} -k {folder} {DURABLE_OPTIONS}"
    run(as_user, bin_dir / "pg_ctl", "-D", data, "-w", "-l", folder / "log", "-o", options, "start")
    try:
        cluster = Cluster(folder, port)
        with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {pgcluster.DATABASE}")
        yield cluster
    finally:
        run(as_user, bin_dir / "pg_ctl", "-D", data, "-m", "fast", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def server_note(cluster: Cluster) -> str:
    """The server's version and the durability settings it runs with, as it reports them."""
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes")
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        values = [conn.execute(f"SHOW {name}").fetchone() for name in names]
    shown = ", ".join(f"{n}={v[0] if v else '?'}" for n, v in zip(names, values, strict=True))
    return f"private PostgreSQL cluster on loopback ({shown}; shared_buffers default)"
