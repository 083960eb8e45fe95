"""Another client's SFTP `stat` while a client with many batches lists `reports/`, against
the same `stat` on a quiet endpoint, in one run.

The lister `acme` has `batches` archived batches (made as bench/_listing.py makes a
history) and a report in the outbox for each; it lists `reports/` again and again with
OpenSSH's `sftp` (`ls -l reports`, a process of its own). Meanwhile the other client, in
this process, calls paramiko's `stat` on a file of its own folder one call after another;
each call's round trip is one sample. Quiet: the same calls with no listing running, in
turns with the listings.

Used by bench/sftp.py.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import paramiko
from _common import BenchResult, percentile
from _listing import history
from _sftp_servers import TimedSession, builtin_endpoint, client_argv, keygen

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings

TARGET_RATIO = 2.0
LISTER = "acme"  # the client _listing.history makes
PROBE = "other"
QUIET_CALLS = 100  # per turn


def listing_figures(result: BenchResult, batches: int, listings: int) -> None:
    """`stat` latency quiet and under `listings` listings of a `batches`-report folder."""
    with tempfile.TemporaryDirectory(prefix="bench-sftp-ls-") as tmp:
        work = Path(tmp)
        home = work / "home"
        _seed(home, batches)
        keys = {LISTER: keygen(work / "lister-key"), PROBE: keygen(work / "probe-key")}
        with builtin_endpoint(home, keys) as server:
            port = server.port
            prober = _paramiko(port, keys[PROBE])
            try:
                quiet, busy, per_listing, shown = _rounds(prober, port, keys[LISTER], listings)
            finally:
                prober.get_channel().get_transport().close()  # type: ignore[union-attr]
    if shown != batches:
        raise RuntimeError(f"the listing showed {shown} reports, not {batches}")
    _add(result, quiet, busy, per_listing, batches, listings)


def _seed(home: Path, batches: int) -> None:
    """`acme` with `batches` archived batches and their reports; `other` with a file."""
    history(home, batches)[3]()  # the history; its API server is not used here
    app = build_app(load_settings(home=home))
    app.billing.add_client(PROBE, 0)
    outbox = app.settings.outbox_path
    outbox.mkdir(parents=True, exist_ok=True)
    rows = app.store.page_batches(client_id=LISTER, limit=sys.maxsize)
    for row in rows:
        (outbox / f"{row.batch_id}.json").write_text('{"tasks": []}\n', encoding="utf-8")
    probe = app.settings.inbox_path / PROBE
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "probe.json").write_text("{}", encoding="utf-8")


def _paramiko(port: int, key: Path) -> paramiko.SFTPClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(
        "127.0.0.1",
        port=port,
        username=PROBE,
        pkey=paramiko.Ed25519Key.from_private_key_file(str(key)),
        allow_agent=False,
        look_for_keys=False,
    )
    return client.open_sftp()


def _stats(
    client: paramiko.SFTPClient, calls: int, until: threading.Event | None = None
) -> list[float]:
    """Round trips of `stat`, `calls` of them (or until `until` is set)."""
    samples = []
    while len(samples) < calls if until is None else not until.is_set():
        started = time.perf_counter()
        client.stat("probe.json")
        samples.append(time.perf_counter() - started)
    return samples


def _rounds(
    prober: paramiko.SFTPClient, port: int, key: Path, listings: int
) -> tuple[list[float], list[float], list[float], int]:
    """Quiet and busy stat samples, in turns: QUIET_CALLS quiet calls, then calls for as
    long as one listing of `reports/` runs, `listings` times (so load elsewhere on the
    machine weighs on both alike); each listing's seconds; how many reports it showed."""
    quiet: list[float] = []
    busy: list[float] = []
    per_listing: list[float] = []
    with TimedSession(client_argv(port, key, LISTER), Path.cwd()) as session:
        _stats(prober, QUIET_CALLS)  # warm-up
        for _ in range(listings):
            quiet += _stats(prober, QUIET_CALLS)
            done = threading.Event()
            thread = threading.Thread(
                target=_list_once, args=(session, per_listing, done), name="bench-lister"
            )
            thread.start()
            busy += _stats(prober, 0, until=done)
            thread.join()
        shown = sum(1 for line in session.output if line.rstrip().endswith(".json"))
    return quiet, busy, per_listing, shown


def _list_once(session: TimedSession, seconds: list[float], done: threading.Event) -> None:
    try:
        seconds.append(session.run("ls -l reports\n"))
    finally:
        done.set()


def _add(
    result: BenchResult,
    quiet: list[float],
    busy: list[float],
    per_listing: list[float],
    batches: int,
    listings: int,
) -> None:
    for label, samples in (("quiet", quiet), (f"while {batches} reports are listed", busy)):
        result.add(
            f"another client's stat, {label}: p50",
            percentile(samples, 50) * 1000,
            "ms",
            note=f"mean {statistics.mean(samples) * 1000:.2f} ms, p95 "
            f"{percentile(samples, 95) * 1000:.1f} ms, max {max(samples) * 1000:.1f} ms, "
            f"{len(samples)} calls",
        )
    for pct in (50, 95):
        ratio = percentile(busy, pct) / percentile(quiet, pct)
        result.add(
            f"stat under listing / quiet (p{pct})",
            ratio,
            "",
            f"<= {TARGET_RATIO:.0f}",
            ratio <= TARGET_RATIO,
        )
    result.add(
        f"ls -l reports ({batches} reports), median",
        percentile(per_listing, 50),
        "s",
        note=f"{listings} listings with OpenSSH sftp, in turns with the quiet calls",
    )
    result.info["listing setup"] = (
        f"client acme: {batches} archived batches, a report each in the outbox; OpenSSH sftp "
        "lists reports/ while another client (paramiko, this process) stats a file of its "
        "own; built-in endpoint in a subprocess over loopback"
    )
