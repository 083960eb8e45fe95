"""Only the commands that set a service up create a state folder (statefolder.py): on a
mistyped home or a volume not mounted yet, every other command says so in one line
(exit 2) and creates nothing; and the drop folders of a new state are made only inside
folders that are there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dropbox_eval.cli import main

BATCH = "20260101-000000-abc"
NEEDS_A_STATE = [
    ["clients", "fund", "acme", "1"],
    ["clients", "api-key", "acme"],
    ["clients", "rotate-secret", "acme"],
    ["clients", "add-key", "acme", "{elsewhere}/key.pub"],
    ["clients", "remove-key", "acme", "SHA256:x"],
    ["clients", "keys", "acme"],
    ["clients", "revoke-key", "acme", "ak_0"],
    ["clients", "disable", "acme"],
    ["clients", "enable", "acme"],
    ["clients", "remove", "acme"],
    ["audit"],
    ["clients", "list"],
    ["emit", BATCH],
    ["cancel", BATCH],
    ["retry", BATCH],
    ["poll"],
    ["run", "--once"],
    ["submit", "{elsewhere}/batch.json"],
    ["pause"],
    ["resume"],
    ["check"],
    ["check", "--repair"],
    ["status"],
    ["serve", "--port", "0"],
    ["sftp", "--port", "0"],
]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SAAS_EVAL_", "SANDBOX_")):
            monkeypatch.delenv(key)
    # a complete forge configuration: what is missing is the state, nothing else
    monkeypatch.setenv("SAAS_EVAL_GITEA_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SAAS_EVAL_GITEA_TOKEN", "token")
    monkeypatch.setenv("SAAS_EVAL_OWNER", "eval")


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("command", NEEDS_A_STATE, ids=" ".join)
def test_a_command_on_an_empty_home_creates_nothing_and_says_so(
    tmp_path: Path, command: list[str]
) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (elsewhere / "key.pub").write_text("ssh-ed25519 AAAA x\n")
    (elsewhere / "batch.json").write_text('{"client_id": "acme", "tasks": []}')
    args = [part.format(elsewhere=elsewhere) for part in command]
    result = CliRunner().invoke(main, ["--home", str(home), *args])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: no dropbox-eval state at {home / 'state'}: point --home or --state-dir "
        "(SAAS_EVAL_HOME / SAAS_EVAL_STATE_DIR) at the service's folder (`dropbox-eval "
        "clients add` or `run` creates a new one)"
    ]
    assert list(home.iterdir()) == []


@pytest.mark.usefixtures("env")
def test_a_new_state_makes_its_inbox_only_inside_a_folder_that_is_there(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True)  # an empty mount point: a new state all the same
    share = tmp_path / "share"  # not mounted: its folder is not there
    runner = CliRunner()
    result = runner.invoke(main, ["--home", str(home), "clients", "add", "acme"])
    assert result.exit_code == 0, result.output
    assert (home / "inbox").is_dir() and (home / "outbox").is_dir()

    other = tmp_path / "other"
    flags = ["--home", str(other), "--inbox", str(share / "inbox")]
    result = runner.invoke(main, [*flags, "clients", "add", "acme"])
    assert result.exit_code == 0, result.output
    assert (other / "state" / "batches").is_dir() and (other / "outbox").is_dir()
    assert not share.exists()  # neither the inbox nor its parent on the disk beneath


def test_a_state_folder_that_is_a_dangling_symlink_is_a_setting_to_fix(tmp_path: Path) -> None:
    """A state volume not mounted yet behind a symlink: one line naming it, exit 2 (systemd
    does not restart the unit for it), nothing made through the link."""
    home, volume = tmp_path / "home", tmp_path / "volume" / "state"
    home.mkdir()
    (home / "state").symlink_to(volume)
    for args in (["clients", "add", "acme"], ["status"]):
        result = CliRunner().invoke(main, ["--home", str(home), *args])
        assert result.exit_code == 2, result.output
        assert result.output.splitlines() == [
            f"error: SAAS_EVAL_STATE_DIR: {home / 'state'} is a symlink to {volume}, which is "
            "not there (a volume not mounted yet?)"
        ]
    assert not volume.parent.exists()
