"""A private PostgreSQL cluster for the benches, durable as a production server is (fsync,
synchronous commits and full-page writes on), unlike the tests' cluster (durability off:
never measure on it). Its start-up and clean-up are the tests' (tests/pgcluster.py, imported
from there): a temp folder, a free loopback port, Debian's server binaries, run as `postgres`
when we are root.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import psycopg

DURABLE_OPTIONS = (  # PostgreSQL's defaults for durability, said out loud
    "-c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on"
    " -c full_page_writes=on -c max_connections=200"
)


sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # not a package
import pgcluster  # noqa: E402
from pgcluster import Cluster as Cluster  # noqa: E402  (re-exported)


def durable_cluster() -> contextlib.AbstractContextManager[Cluster]:
    """A running cluster with an empty database (`Cluster.fresh_url` gives a migrated
    schema of it), durable; stopped and removed after."""
    return pgcluster.running(DURABLE_OPTIONS)


def server_note(cluster: Cluster) -> str:
    """The server's version and the durability settings it runs with, as it reports them."""
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes")
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        values = [conn.execute(f"SHOW {name}").fetchone() for name in names]
    shown = ", ".join(f"{n}={v[0] if v else '?'}" for n, v in zip(names, values, strict=True))
    return f"private PostgreSQL cluster on loopback ({shown}; shared_buffers default)"
