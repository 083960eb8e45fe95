"""The deployment files in `deploy/` (issue 22): the systemd units pass `systemd-analyze
verify` (Debian's `systemd` package) with their hardening, the example environment file
lists exactly the settings there are, and the sysusers/tmpfiles files create the user and
the home. Without systemd-analyze the unit test is skipped with the reason, except under
CI=true, where that is a failure (`.ci/run` installs the package).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

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
