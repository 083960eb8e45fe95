"""Defects a new operator met following the README, each pinned by a regression test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import tasks

from dropbox_eval.cli import main
from dropbox_eval.errors import EXIT_USAGE
from dropbox_eval.sandbox import SandboxForge


class Cli:
    """`dropbox-eval` in-process, rooted in a tmp home, the token in the environment."""

    def __init__(self, home: Path, forge: SandboxForge) -> None:
        self.home = home
        self.forge = forge
        self.runner = CliRunner()
        self.base = ["--home", str(home), "--gitea-url", forge.url, "--owner", forge.user]

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return self.runner.invoke(main, [*self.base, *args], env=env)

    def submit(self, count: int, client: str = "acme") -> str:
        source = self.home / f"b{count}-{client}.json"
        source.write_text(json.dumps({"client_id": client, "tasks": tasks(count)}))
        result = self("submit", str(source), "--json")
        assert result.exit_code == 0, result.output
        return str(json.loads(result.stdout)["batch_id"])


@pytest.fixture
def cli(tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch) -> Cli:
    for key in list(os.environ):
        if key.startswith(("SAAS_EVAL_", "SANDBOX_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SAAS_EVAL_GITEA_TOKEN", forge.token)
    return Cli(tmp_path, forge)


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("SANDBOX_LANE_MODE", "bogus", ["sandbox", "--port", "0"]),
        ("SANDBOX_FLAVOR", "forgejoo", ["run", "--sandbox", "--once"]),
        ("SANDBOX_MERGE_RATIO", "abc", ["demo"]),
    ],
)
def test_a_bad_sandbox_variable_is_one_line_naming_it_exit_2(
    cli: Cli, variable: str, value: str, command: list[str]
) -> None:
    result = cli(*command, env={variable: value})
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {variable}: "), lines
    assert repr(value) in lines[0]
