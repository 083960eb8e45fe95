"""Uploads through the built-in SFTP endpoint against OpenSSH's sshd + sftp-server, in one
run: many small files, and one large file.

Both servers are reached the same way (OpenSSH's `sftp` client over SSH on loopback, one
long-lived batch session per server and round, see _sftp_servers.TimedSession), so the
ratio compares what each server does per file. The service does not run: what is measured
is the door, up to the moment the upload is in place (the built-in endpoint's accounting
still looks for each file's receipt, as it does beside a service). Small files are one-task
batch files (about 200 bytes); each round uploads them to new names with one `put` each;
the figure is the median over rounds of the seconds per file.

The disk's limit is measured in the same rounds: a raw loop doing what a durable close
needs and nothing else (create, write, fdatasync, rename, fsync the folder: two flushes a
file, answered one after the other as one session's closes are). OpenSSH's time plus that
floor is the best a server making each close durable could do over the same transport.

Used by bench/sftp.py.
"""

from __future__ import annotations

import getpass
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import BenchResult, make_tasks
from _sftp_servers import TimedSession, builtin_endpoint, client_argv, keygen, openssh_sshd

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings
from dropbox_eval.util.names import OUTCOME_DIRS

TARGET_SMALL = 1.5  # built-in / OpenSSH, seconds per small file
TARGET_LARGE = 1.0  # built-in / OpenSSH, one large file
CLIENT = "bench"
FLOOR = "durable floor"
PARALLEL = 4  # sessions of one client at once (SAAS_EVAL_SFTP_MAX_SESSIONS' default)
VARIANTS = {  # name: (server, how)
    "builtin": ("builtin", "one session"),
    "openssh": ("openssh", "one session"),
    "openssh -f": ("openssh", "fsync"),  # put -f: fsync@openssh.com, the file's data durable
    "builtin x4": ("builtin", "parallel"),
    "openssh x4": ("openssh", "parallel"),
    "builtin big": ("builtin", "big"),
    "openssh big": ("openssh", "big"),
}


def upload_figures(result: BenchResult, files: int, big_mb: int, rounds: int) -> None:
    """Per-file seconds (and server CPU) of `files` small uploads, one session and
    PARALLEL sessions at once, and one `big_mb` MB upload, per server."""
    with tempfile.TemporaryDirectory(prefix="bench-sftp-up-") as tmp:
        work = Path(tmp)
        source = _sources(work / "source", files, big_mb)
        key = keygen(work / "client-key")
        home = work / "home"
        build_app(load_settings(home=home)).billing.add_client(CLIENT, 0)
        folder = home / "inbox" / CLIENT
        for outcome in OUTCOME_DIRS:  # as the service makes them: accounting looks there
            (folder / outcome).mkdir(parents=True, exist_ok=True)
        openssh_folder = work / "openssh-inbox"
        openssh_folder.mkdir()
        seconds: dict[str, list[float]] = {name: [] for name in [*VARIANTS, FLOOR]}
        cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
        with (
            builtin_endpoint(home, {CLIENT: key}) as builtin,
            openssh_sshd(work, key) as openssh,
        ):
            client = {
                "builtin": (builtin, client_argv(builtin.port, key, CLIENT), ""),
                "openssh": (openssh, client_argv(openssh.port, key, _user()), str(openssh_folder)),
            }
            for number in range(rounds):
                for index, (name, (server_name, how)) in enumerate(VARIANTS.items()):
                    server, argv, where = client[server_name]
                    cpu_before = server.cpu_seconds()
                    seconds[name].append(
                        _timed(how, argv, source, where, files, f"v{index}r{number}")
                    )
                    time.sleep(0.3)  # sshd reaps the sessions (their CPU joins the master's)
                    cpu[name].append((server.cpu_seconds() - cpu_before) / files)
                seconds[FLOOR].append(_durable_floor(work / f"floor{number}", source, files))
    _add(result, seconds, cpu, files, big_mb, rounds)


def _timed(how: str, argv: list[str], source: Path, where: str, files: int, tag: str) -> float:
    """Seconds per file of one variant's uploads (`how`: VARIANTS' second part)."""
    if how == "big":
        with TimedSession(argv, source, where) as session:
            return session.run(f"put big.bin {tag}.tmp\n")
    sessions = PARALLEL if how == "parallel" else 1
    flag = " -f" if how == "fsync" else ""
    scripts = [_puts(range(n, files, sessions), tag, flag) for n in range(sessions)]
    opened = [TimedSession(argv, source, where) for _ in scripts]
    try:
        with ThreadPoolExecutor(sessions) as pool:
            started = time.perf_counter()
            list(pool.map(lambda pair: pair[0].run(pair[1]), zip(opened, scripts, strict=True)))
            return (time.perf_counter() - started) / files
    finally:
        for session in opened:
            session.__exit__(None, None, None)


def _durable_floor(folder: Path, source: Path, files: int) -> float:
    """Seconds per file of the raw durable-close loop (module docstring) in `folder`."""
    folder.mkdir()
    root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    contents = [(source / f"s{index}.json").read_bytes() for index in range(files)]
    try:
        started = time.perf_counter()
        for index, data in enumerate(contents):
            fd = os.open(f".f{index}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=root)
            try:
                os.write(fd, data)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            os.rename(f".f{index}.tmp", f"f{index}.json", src_dir_fd=root, dst_dir_fd=root)
            os.fsync(root)
        return (time.perf_counter() - started) / files
    finally:
        os.close(root)


def _sources(source: Path, files: int, big_mb: int) -> Path:
    source.mkdir()
    for index in range(files):
        batch = {"batch_ref": f"up-{index}", "tasks": make_tasks(1, f"u{index}-")}
        (source / f"s{index}.json").write_text(json.dumps(batch), encoding="utf-8")
    (source / "big.bin").write_bytes(b"x" * (big_mb << 20))
    return source


def _puts(indexes: range, tag: str, flag: str) -> str:
    return "".join(f"put{flag} s{i}.json {tag}-{i}.json\n" for i in indexes)


def _user() -> str:
    return getpass.getuser()


def _paired_ratio(seconds: dict[str, list[float]], builtin: str, openssh: str) -> float:
    """The median of each round's built-in / OpenSSH: the two ran a moment apart, so a
    burst of load elsewhere on the machine weighs on both."""
    pairs = zip(seconds[builtin], seconds[openssh], strict=True)
    return statistics.median(mine / theirs for mine, theirs in pairs)


def _add(
    result: BenchResult,
    seconds: dict[str, list[float]],
    cpu: dict[str, list[float]],
    files: int,
    big_mb: int,
    rounds: int,
) -> None:
    median = {name: statistics.median(values) * 1000 for name, values in seconds.items()}
    rows = (
        ("builtin", "openssh", f"{files} small puts, one session", TARGET_SMALL),
        ("builtin", "openssh -f", f"{files} small puts, OpenSSH with put -f (fsync)", None),
        ("builtin x4", "openssh x4", f"{files} small puts, {PARALLEL} sessions at once", None),
        ("builtin big", "openssh big", f"one {big_mb} MB put", TARGET_LARGE),
    )
    for mine, theirs, label, target in rows:
        ratio = _paired_ratio(seconds, mine, theirs)
        unit = "ms per file" if "small" in label else "ms"
        result.add(
            f"built-in / OpenSSH, {label}",
            ratio,
            "",
            f"<= {target}" if target else "",
            ratio <= target if target else None,
            note=f"{median[mine]:.2f} vs {median[theirs]:.2f} {unit}; median of {rounds} "
            "rounds' ratios",
        )
    floor = _paired_ratio(seconds, FLOOR, "openssh")
    result.add(
        "disk floor / OpenSSH, per small file: two flushes alone",
        floor,
        "",
        note=f"{median[FLOOR]:.2f} vs {median['openssh']:.2f} ms per file: the raw "
        "create/write/fdatasync/rename/fsync-folder loop; a durable close cannot cost less "
        f"than OpenSSH's time plus this, {1 + floor:.2f} times OpenSSH's",
    )
    beyond = [
        mine / (theirs + flushes)
        for mine, theirs, flushes in zip(
            seconds["builtin"], seconds["openssh"], seconds[FLOOR], strict=True
        )
    ]
    result.add(
        f"built-in / (OpenSSH + disk floor), {files} small puts, one session",
        statistics.median(beyond),
        "",
        note="the product against the best a durable close could do over the same transport",
    )
    cpu_ms = {name: statistics.median(values) * 1000 for name, values in cpu.items()}
    result.add(
        "server CPU per small put: built-in / OpenSSH, one session",
        cpu_ms["builtin"] / cpu_ms["openssh"],
        "",
        note=f"{cpu_ms['builtin']:.2f} vs {cpu_ms['openssh']:.2f} ms (the endpoint process; "
        "sshd with its sessions and their sftp-server), login included; less sensitive to "
        "load than wall time",
    )
    result.info["uploads setup"] = (
        "OpenSSH sftp client over SSH on loopback to each server (sshd's sftp subsystem: "
        "/usr/lib/openssh/sftp-server), one batch session per variant and round (or "
        f"{PARALLEL} at once); no service running; one-task batch files of ~200 bytes, each "
        "to a new name; the built-in endpoint makes each upload durable before its close is "
        "answered (the file's fdatasync, begun at its first write, then the folder's "
        "fsync, shared), OpenSSH's server fsyncs nothing unless "
        "asked (put -f: the file only)"
    )
