"""`dropbox-eval ARGS` in a child process forked from a warm one.

A fresh `python -m dropbox_eval run --once` spends ~0.6 s of CPU importing the app before
its first write; the crash-point walks start one such child per durable write, which was
a fifth of the suite's CPU. Here each child is forked from multiprocessing's fork server,
started once per test process with the app's modules already imported: the child is still
its own process (its own state, its own descriptors, killed by its own crash point), and
runs the same `main` a fresh one runs, with the given environment, folder and argv (what
the app reads from the environment at import, the crash point, it reads again).

A child whose environment preloads a library (LD_PRELOAD: libfaketime) needs a fresh
interpreter, and is started as one. What differs from a fresh one: the children of one test
process share the fork server's hash seed, and an uncaught exception's traceback follows a
`Process ForkServerProcess-N:` line.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dropbox_eval.util import crashpoints

PRELOAD = ["dropbox_eval.cli", "dropbox_eval.app", "dropbox_eval.service"]
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


@dataclass
class Finished:
    """How a child ended: its exit code (negative: the signal that killed it) and output."""

    returncode: int
    stdout: str
    stderr: str


def run(
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 120,
    *,
    cwd: Path | str | None = None,
    input: str | None = None,  # noqa: A002 - subprocess.run's name
) -> Finished:
    """Run `dropbox-eval ARGS` with exactly `env` (this process's when None), in `cwd` (this
    folder when None), `input` on its standard input, up to `timeout` seconds (then it is
    killed and TimeoutError raised)."""
    env = dict(os.environ) if env is None else env
    folder_of = str(cwd) if cwd is not None else os.getcwd()
    if "LD_PRELOAD" in env:
        done = subprocess.run(
            [sys.executable, "-m", "dropbox_eval", *args],
            env=env,
            cwd=folder_of,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Finished(done.returncode, done.stdout, done.stderr)
    if not os.path.isdir(folder_of):  # as subprocess.run says it, in this process
        raise FileNotFoundError(f"no folder {folder_of}")
    with tempfile.TemporaryDirectory(prefix="forkrun-") as folder:
        streams = [Path(folder, name) for name in ("in", "out", "err")]
        streams[0].write_text(input or "", encoding="utf-8")
        paths = [str(path) for path in streams]
        child = _context.Process(target=_main, args=(args, env, folder_of, paths))
        child.start()
        try:
            child.join(timeout)
        finally:  # whatever ends the wait (its time, ^C), the command does not outlive it
            ended = child.exitcode is not None
            if not ended:
                child.kill()
                child.join()
        if not ended:
            tail = _text(streams[2])[-3000:]
            raise TimeoutError(f"dropbox-eval {' '.join(args)} ran past {timeout} s: {tail}")
        return Finished(child.exitcode, _text(streams[1]), _text(streams[2]))


def _main(args: list[str], env: dict[str, str], cwd: str, streams: list[str]) -> None:
    """In the child: the environment, folder, standard streams and argv of a fresh process,
    then the command line's `main` (its SystemExit is the child's exit code)."""
    for descriptor, path in enumerate(streams):  # first: what fails below is said there
        flags = os.O_RDONLY if descriptor == 0 else os.O_WRONLY | os.O_TRUNC
        opened = os.open(path, flags | os.O_CREAT, 0o600)
        os.dup2(opened, descriptor)
        os.close(opened)
    # multiprocessing put devnull there; this one is the process's for its life, read as
    # a fresh interpreter reads its own (no newline translation, undecodable bytes kept)
    sys.stdin = open(  # noqa: SIM115
        0, encoding="utf-8", errors="surrogateescape", newline="\n", closefd=False
    )
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    crashpoints.from_environment()  # read at import, in the fork server
    os.chdir(cwd)
    sys.argv = ["dropbox-eval", *args]
    from dropbox_eval.cli import main

    main(args=args, prog_name="dropbox-eval")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")  # strict, as subprocess.run(text=True)
    except FileNotFoundError:
        return ""
