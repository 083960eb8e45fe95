"""The client guide's SFTP recipes (docs/client/sftp.md), run as written with the real
OpenSSH `sftp`, `lftp` and `curl`, in a fresh home that never connected: the host key is
pinned with the line `dropbox-eval sftp --known-hosts-line` prints, and only with it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from sftp_stack import Stack, running_stack

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "client" / "sftp.md"
UPLOADED = ("batch.json", "lftp.json", "curl.json")  # the names the recipes upload as


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("recipes"), ("acme",)) as stack:
        stack.app.billing.fund("acme", 10)
        yield stack


def upload_recipes() -> str:
    """The guide's first shell block after it tells a new client what to do."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("Client, on a machine that never connected before")
    return re.findall(r"```sh\n(.*?)```", text[start:], re.S)[0]


def known_hosts_line(stack: Stack) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dropbox_eval", "sftp", "--known-hosts-line", "127.0.0.1"]
        + ["--port", str(stack.port)],
        env={**os.environ, "SAAS_EVAL_HOME": str(stack.home)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def as_run_here(recipe: str, stack: Stack, line: str) -> str:
    """The recipe against the test's endpoint: its address, port and host key line."""
    pinned = re.sub(r"echo '[^']*' > ", f"echo '{line}' > ", recipe, count=1)
    assert pinned != recipe, "the recipe no longer saves the line the operator sent"
    return pinned.replace("dropbox.example.com", "127.0.0.1").replace("2222", str(stack.port))


def test_the_guide_pins_the_host_key_in_every_recipe() -> None:
    recipe = upload_recipes()
    assert recipe.count("UserKnownHostsFile=dropbox-eval.known_hosts") == 2  # sftp, lftp
    assert "--hostpubsha256" in recipe and "StrictHostKeyChecking=no" not in recipe
    assert "-hostkey=" in GUIDE.read_text(encoding="utf-8")  # WinSCP, not run here


def test_the_recipes_upload_with_the_real_clients_in_a_fresh_home(
    endpoint: Stack, tmp_path: Path
) -> None:
    for tool in ("sftp", "lftp", "curl", "ssh-keygen"):
        if shutil.which(tool) is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI must run the guide's recipes: {tool} is not installed")
            pytest.skip(f"{tool} is not installed (`.ci/run` installs it)")
    line = known_hosts_line(endpoint)
    assert re.fullmatch(rf"\[127\.0\.0\.1\]:{endpoint.port} ssh-ed25519 \S+", line), line
    home = tmp_path / "home"  # never connected: no known_hosts, no ssh config
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    for suffix in ("", ".pub"):
        shutil.copy(f"{endpoint.keys['acme']}{suffix}", work / f"acme_ed25519{suffix}")
    (work / "acme_ed25519").chmod(0o600)
    batch = {"tasks": [{"task_id": "t1", "title": "from the guide"}]}
    (work / "batch.json").write_text(json.dumps(batch), encoding="utf-8")
    script = as_run_here(upload_recipes(), endpoint, line)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=work,
        env={"PATH": os.environ["PATH"], "HOME": str(home), "LC_ALL": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    accepted = endpoint.folder() / "accepted"
    assert wait_for(
        lambda: all((accepted / f"{name}.receipt.json").exists() for name in UPLOADED)
    ), sorted(p.name for p in endpoint.folder().rglob("*"))


def test_a_wrong_pin_is_refused(endpoint: Stack, tmp_path: Path) -> None:
    """The pin is what lets a client in: another key's line fails before anything is sent."""
    if shutil.which("sftp") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH's client is not installed")
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    line = f"[127.0.0.1]:{endpoint.port} {kind} {blob}"
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(endpoint.keys["acme"], work / "acme_ed25519")
    (work / "batch.json").write_text("{}", encoding="utf-8")
    sftp_only = as_run_here(upload_recipes(), endpoint, line).split("\n# lftp")[0]
    done = subprocess.run(
        ["bash", "-eu", "-c", sftp_only],
        cwd=work,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "Host key verification failed" in done.stderr
