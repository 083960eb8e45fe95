"""The deployment files in `deploy/`: the systemd units pass `systemd-analyze
verify` (Debian's `systemd` package) with their hardening, the example environment file
lists exactly the settings there are, and the sysusers/tmpfiles files create the user and
the home. Without systemd-analyze the unit test is skipped with the reason, except under
CI=true, where that is a failure (`.ci/run` installs the package).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import PATIENCE, tasks, wait_for

from dropbox_eval.cli import main
from dropbox_eval.cli.service import run
from dropbox_eval.cli.sftp import sftp_command
from dropbox_eval.config import ENV_PREFIX, Settings, load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNITS = ("dropbox-eval.service", "dropbox-eval-sftp.service")
SHIPPED_BINARY = "/opt/dropbox-eval/bin/dropbox-eval"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "RestrictSUIDSGID": "yes",
    "CapabilityBoundingSet": "",
    "User": "dropbox-eval",
    "EnvironmentFile": "/etc/dropbox-eval/dropbox-eval.env",
}


def unit_keys(text: str) -> dict[str, list[str]]:
    """`Key=value` lines of a unit's [Service] section (a key may repeat)."""
    keys: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys.setdefault(key, []).append(value)
    return keys


def env_lines(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(set, commented): `SAAS_EVAL_X=value` lines of an environment file."""
    active: dict[str, str] = {}
    shown: dict[str, str] = {}
    for line in text.splitlines():
        target = shown if line.startswith("#") else active
        name, sep, value = line.lstrip("#").partition("=")
        if sep and name.startswith(ENV_PREFIX) and name.strip() == name:
            assert name not in active and name not in shown, f"{name} is listed twice"
            target[name] = value
    return active, shown


def cli_variables() -> set[str]:
    """Variables the command line reads besides the settings (`--http-port` ...)."""
    params = [*main.params, *run.params, *sftp_command.params]
    return {
        p.envvar
        for p in params
        if isinstance(p, click.Option) and isinstance(p.envvar, str) and p.envvar[:10] == ENV_PREFIX
    }


def venv_binary() -> str:
    found = Path(sys.executable).parent / "dropbox-eval"
    assert found.exists(), f"the package's console script is not installed next to {sys.executable}"
    return str(found)


@pytest.mark.parametrize("name", UNITS)
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path, name: str) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        missing = "systemd-analyze is not installed (Debian: apt-get install systemd)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must verify the units: {missing}")
        pytest.skip(missing)
    text = (DEPLOY / name).read_text(encoding="utf-8")
    # verify checks that ExecStart's binary exists: point the copy at this installation's
    assert text.count(SHIPPED_BINARY) == 1
    (tmp_path / name).write_text(text.replace(SHIPPED_BINARY, venv_binary()), encoding="utf-8")
    verified = subprocess.run(
        [tool, "verify", "--man=no", name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # systemd reports an unknown key or a bad value as a warning with exit 0: none allowed
    assert verified.returncode == 0 and not verified.stdout + verified.stderr, (
        verified.stdout + verified.stderr
    )


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    """The check above can fail: a misspelt hardening key is reported."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    text = (DEPLOY / UNITS[0]).read_text(encoding="utf-8").replace(SHIPPED_BINARY, venv_binary())
    (tmp_path / UNITS[0]).write_text(text.replace("ProtectSystem=", "ProtectSytem="), "utf-8")
    verified = subprocess.run(
        [tool, "verify", "--man=no", UNITS[0]], cwd=tmp_path, capture_output=True, text=True
    )
    assert "ProtectSytem" in verified.stdout + verified.stderr


@pytest.mark.parametrize("name", UNITS)
def test_the_units_are_hardened_and_agree_with_the_environment_file(name: str) -> None:
    keys = unit_keys((DEPLOY / name).read_text(encoding="utf-8"))
    for key, value in HARDENING.items():
        assert keys.get(key) == [value], (name, key, keys.get(key))
    active, _ = env_lines((DEPLOY / "dropbox-eval.env").read_text(encoding="utf-8"))
    home = active[f"{ENV_PREFIX}HOME"]
    assert keys["ReadWritePaths"] == [home] and keys["WorkingDirectory"] == [home]
    command = keys["ExecStart"][0].split()
    assert command[0] == SHIPPED_BINARY
    # the command line is one the CLI takes (`--help` after it parses the options first)
    accepted = subprocess.run(
        [venv_binary(), *command[1:], "--help"], capture_output=True, text=True, timeout=120
    )
    assert accepted.returncode == 0, accepted.stderr


def test_the_environment_file_lists_every_setting_and_only_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    active, shown = env_lines((DEPLOY / "dropbox-eval.env").read_text(encoding="utf-8"))
    settings = {f"{ENV_PREFIX}{name.upper()}": name for name in Settings.model_fields}
    listed = active.keys() | shown.keys()
    assert listed - settings.keys() - cli_variables() == set()  # nothing that does not exist
    assert settings.keys() - listed == set()  # every setting there is
    assert cli_variables() - listed == set()
    for variable, value in shown.items():  # a commented line shows the default
        field = settings.get(variable)
        if field is None or field.endswith("_file"):
            continue
        default = Settings.model_fields[field].default
        parsed = getattr(load_settings(**{field: value}), field)
        assert default is None or parsed == default, (variable, value, default)
    for variable, value in active.items():  # read alike by systemd and by `sh` (`set -a; .`)
        assert re.fullmatch(r"[^\s'\"$`\\]+", value), (variable, value)
    # the uncommented lines, once the token file exists, are a complete configuration
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for variable, value in active.items():
        monkeypatch.setenv(variable, value)
    token = tmp_path / "gitea-token"
    token.write_text("t0ken\n", encoding="utf-8")
    monkeypatch.setenv(f"{ENV_PREFIX}GITEA_TOKEN_FILE", str(token))
    configured = load_settings()
    configured.require_forge()
    assert configured.gitea_token == "t0ken"


def test_sysusers_and_tmpfiles_create_the_user_and_the_home(tmp_path: Path) -> None:
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not installed (Debian: apt-get install systemd)")
    for kind in ("sysusers", "tmpfiles"):
        folder = tmp_path / "etc" / f"{kind}.d"
        folder.mkdir(parents=True)
        shutil.copy(DEPLOY / f"dropbox-eval.{kind}", folder / "dropbox-eval.conf")
    made = subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}"], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text(encoding="utf-8").splitlines()
    (user,) = [line.split(":") for line in passwd if line.startswith("dropbox-eval:")]
    assert user[5] == "/srv/dropbox-eval" and user[6] == "/usr/sbin/nologin"
    created = subprocess.run(
        ["systemd-tmpfiles", "--create", f"--root={tmp_path}"], capture_output=True, text=True
    )
    assert created.returncode == 0, created.stderr
    home = (tmp_path / "srv" / "dropbox-eval").stat()
    assert oct(home.st_mode & 0o777) == "0o750"
    if os.geteuid() == 0:  # only root can give it to the user
        assert (home.st_uid, home.st_gid) == (int(user[2]), int(user[3]))


def _syscall_group(name: str) -> frozenset[str]:
    """The system calls of a systemd filter group (`@system-service`), nested ones expanded."""
    listed = subprocess.run(
        ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    calls: set[str] = set()
    for line in listed.stdout.splitlines()[1:]:
        word = line.strip()
        if word and not word.startswith("#"):
            calls |= _syscall_group(word) if word.startswith("@") else {word}
    return frozenset(calls)


def _unit_filter(name: str) -> frozenset[str]:
    """What the unit's `SystemCallFilter=` lines allow: the first an allow list, each `~`
    line taking its groups out of it."""
    allowed: set[str] = set()
    for value in unit_keys((DEPLOY / name).read_text(encoding="utf-8"))["SystemCallFilter"]:
        groups = {call for group in value.lstrip("~").split() for call in _syscall_group(group)}
        allowed = allowed - groups if value.startswith("~") else allowed | groups
    return frozenset(allowed)


def _traced(command: list[str], summary: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`command` under `strace -f -c` (a count of every system call, to `summary`)."""
    return subprocess.Popen(
        ["strace", "-f", "-c", "-o", str(summary), *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _stop_traced(tracer: subprocess.Popen[str], summary: Path) -> set[str]:
    """SIGTERM the traced program (strace's child), wait, and read the calls it made."""
    (child,) = Path(f"/proc/{tracer.pid}/task/{tracer.pid}/children").read_text().split()
    os.kill(int(child), signal.SIGTERM)
    tracer.communicate(timeout=PATIENCE)
    rows = [line.split() for line in summary.read_text(encoding="utf-8").splitlines()]
    return {row[-1] for row in rows if len(row) >= 5 and row[-1].isidentifier()} - {
        "syscall",  # the header
        "total",
    }


def test_the_system_call_filter_lets_the_service_and_the_endpoint_work(tmp_path: Path) -> None:
    """Under `SystemCallFilter=` a call outside the list kills the process (SIGSYS): every
    call `run` (a batch from drop to report) and `sftp` (a login and an upload) make is
    in the units' lists."""
    if shutil.which("strace") is None or shutil.which("systemd-analyze") is None:
        missing = "strace and systemd-analyze are needed (Debian: apt-get install strace systemd)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must check the units' system call filter: {missing}")
        pytest.skip(missing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env.update(SAAS_EVAL_HOME=str(tmp_path), SAAS_EVAL_QUIET_PERIOD="0.2")
    env.update(SAAS_EVAL_POLL_INTERVAL="0.3", SAAS_EVAL_SETTLE_SECONDS="0")
    cli = [sys.executable, "-m", "dropbox_eval"]
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    for command in (["clients", "add", "acme", "--credits", "5"], ["clients", "add-key"]):
        extra = ["acme", str(key.with_suffix(".pub"))] if command[-1] == "add-key" else []
        done = subprocess.run([*cli, *command, *extra], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    service = _traced([*cli, "run", "--sandbox", "--lane-delay", "0.3"], tmp_path / "run", env)
    endpoint = _traced([*cli, "sftp", "--host", "127.0.0.1", "--port", "0"], tmp_path / "sftp", env)
    try:
        assert endpoint.stdout is not None
        port = endpoint.stdout.readline().rsplit(":", 1)[1].strip()
        (tmp_path / "batch.json").write_text(json.dumps({"tasks": tasks(1)}), encoding="utf-8")
        uploaded = subprocess.run(
            ["sftp", "-F", "/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"]
            + ["-o", f"UserKnownHostsFile={tmp_path / 'known'}", "-i", str(key), "-P", port]
            + ["-b", "-", "acme@127.0.0.1"],
            input=f"put {tmp_path / 'batch.json'} batch.json\nls\n",
            capture_output=True,
            text=True,
            timeout=PATIENCE,
        )
        assert uploaded.returncode == 0, uploaded.stderr
        assert wait_for(lambda: any((tmp_path / "outbox").glob("*.json")))
    finally:
        used = {"run": _stop_traced(service, tmp_path / "run")}
        used["sftp"] = _stop_traced(endpoint, tmp_path / "sftp")
    assert service.returncode == 0 and endpoint.returncode == 0
    for unit, name in (("run", UNITS[0]), ("sftp", UNITS[1])):
        assert "openat" in used[unit] and "inotify_add_watch" in used["run"]
        assert used[unit] - _unit_filter(name) == set(), unit


def test_the_settings_page_names_the_same_variables() -> None:
    table = (DEPLOY.parent / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    documented = set(re.findall(rf"`({ENV_PREFIX}[A-Z0-9_]+)`", table))
    active, shown = env_lines((DEPLOY / "dropbox-eval.env").read_text(encoding="utf-8"))
    assert documented == active.keys() | shown.keys()
