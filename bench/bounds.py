"""Tenant bounds (issue 19): what one party can take from everyone else.

- operator sign-in: 8 threads post wrong keys to `/operator/login` for `--seconds`; how
  many keys were checked (answered 401, the rest 429), and whether the right key is let in
  right after the burst (it must wait for the door too);
- SFTP descriptors: an endpoint started under a 256-descriptor limit (soft and hard, as in
  the issue's review), one client opening `--uploads` uploads in one session: how many it
  got, the endpoint's descriptors after, and whether another client still logs in.

Counts, not times: the figures hold on any machine.

    python bench/bounds.py [--seconds 5] [--uploads 400] [--json]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import requests
from _common import BenchResult, command_line, emit, parser

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings
from dropbox_eval.sftp.keys import KeyStore
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web
from dropbox_eval.web.throttle import FREE_FAILURES

KEY = "the-right-key"
THREADS = 8
DESCRIPTORS = 256


def sign_in_burst(seconds: float) -> tuple[dict[int, int], int]:
    """Answers by status to wrong keys posted for `seconds`, and the right key's answer."""
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as home:
        app = build_app(load_settings(home=home, operator_key=KEY), with_forge=False)
        server = BackgroundServer(create_web(app.web, lambda: {}))
        url = f"{server.start()}/operator/login"
        end = time.monotonic() + seconds

        def hammer(_: int) -> list[int]:
            with requests.Session() as session:
                answers = []
                while time.monotonic() < end:
                    answer = session.post(url, data={"key": "guess"}, allow_redirects=False)
                    answers.append(answer.status_code)
                return answers

        with ThreadPoolExecutor(THREADS) as pool:
            codes = [code for answers in pool.map(hammer, range(THREADS)) for code in answers]
        right = requests.post(url, data={"key": KEY}, allow_redirects=False, timeout=10)
        server.stop()
    return {code: codes.count(code) for code in set(codes)}, right.status_code


def hoarded_descriptors(uploads: int) -> tuple[int, int, bool]:
    """(uploads one client got open, the endpoint's descriptors then, whether another
    client could still log in), with the endpoint under a 256-descriptor limit."""
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as home:
        app = build_app(load_settings(home=home), with_forge=False)
        keys = {}
        for client in ("hoarder", "other"):
            app.billing.add_client(client, 0)
            key = Path(home) / f"key-{client}"
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
            KeyStore(app.settings.state_path).add(client, key.with_suffix(".pub").read_text())
            keys[client] = paramiko.Ed25519Key.from_private_key_file(str(key))
        endpoint = subprocess.Popen(
            [sys.executable, "-m", "dropbox_eval", "sftp", "--host", "127.0.0.1", "--port", "0"],
            env={**os.environ, "SAAS_EVAL_HOME": home},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS)
            ),
        )
        assert endpoint.stdout is not None
        port = int(endpoint.stdout.readline().rsplit(":", 1)[1])
        try:
            hoarder = _session(port, "hoarder", keys["hoarder"])
            opened = []
            for n in range(uploads):
                try:
                    opened.append(hoarder.open(f"h{n}.json.part", "wb"))
                except OSError:
                    continue
            descriptors = len(os.listdir(f"/proc/{endpoint.pid}/fd"))
            try:
                _session(port, "other", keys["other"]).listdir(".")
                other_in = True
            except (paramiko.SSHException, OSError, EOFError):
                other_in = False
        finally:
            endpoint.terminate()
            endpoint.wait(timeout=20)
    return len(opened), descriptors, other_in


def _session(port: int, user: str, key: paramiko.PKey) -> paramiko.SFTPClient:
    transport = paramiko.Transport(("127.0.0.1", port))
    transport.start_client(timeout=10)
    transport.auth_publickey(user, key)
    client = transport.open_sftp_client()
    assert client is not None
    return client


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--seconds", type=float, default=5.0)
    args_parser.add_argument("--uploads", type=int, default=400)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("bounds", command_line())
    answers, right = sign_in_burst(args.seconds)
    checked = answers.get(401, 0)
    allowed = FREE_FAILURES + 1 + int(args.seconds).bit_length()  # 1 s, 2 s, 4 s ... doors
    result.add(
        f"wrong operator keys checked in {args.seconds:.0f} s, {THREADS} threads",
        checked,
        "keys",
        f"<= {allowed}",
        checked <= allowed,
        note=f"{answers.get(429, 0)} answered 429; the seed answered every one 401",
    )
    result.add(
        "right key just after the burst: refused until the door opens",
        right,
        "HTTP",
        "429",
        right == 429,
    )
    opened, descriptors, other_in = hoarded_descriptors(args.uploads)
    result.add(
        f"uploads one SFTP session got open of {args.uploads} (256-descriptor limit)",
        opened,
        "files",
        "<= 16 (SAAS_EVAL_SFTP_MAX_OPEN_FILES)",
        opened <= 16,
        note=f"the endpoint held {descriptors} descriptors then",
    )
    result.add(
        "another client logs in meanwhile",
        int(other_in),
        "",
        "1",
        other_in,
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
