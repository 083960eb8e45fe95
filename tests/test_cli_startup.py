"""The CLI starts fast: `--help`, `--version` and `status` load what they need and no more
(commands load when they run), and the help list says what each command says of itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import PATIENCE

from dropbox_eval.billing.accounts import Billing
from dropbox_eval.cli import COMMANDS, main
from dropbox_eval.store.engine import TinyDBStore

PROBE = """
import json, runpy, sys
sys.argv = ["dropbox-eval", *json.loads(sys.argv[1])]
try:
    runpy.run_module("dropbox_eval", run_name="__main__")
except SystemExit:
    pass
heavy = ("fastapi", "asyncssh", "requests", "uvicorn", "pydantic", "rich", "tinydb")
print(json.dumps(sorted(name for name in heavy if name in sys.modules)), file=sys.stderr)
"""


def loaded_by(*args: str, cwd: Path) -> list[str]:
    """The heavy libraries a `dropbox-eval ARGS` process imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        cwd=cwd,
    )
    loaded: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-h"]])
def test_help_and_version_load_no_library_but_click(args: list[str], tmp_path: Path) -> None:
    assert loaded_by(*args, cwd=tmp_path) == []


def test_status_loads_no_web_framework_ssh_server_or_forge_client(tmp_path: Path) -> None:
    Billing(TinyDBStore(tmp_path / "state"), 1).add_client("acme", 5)  # a state to read
    loaded = loaded_by("--home", str(tmp_path), "status", "--json", cwd=tmp_path)
    assert not {"fastapi", "uvicorn", "asyncssh", "requests"} & set(loaded), loaded
    assert "tinydb" in loaded  # it did read the state


def test_the_help_list_is_what_each_command_says_of_itself() -> None:
    ctx = click.Context(main)
    for name, (module, text) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert command.callback is None or command.callback.__module__.endswith(f".{module}")
        assert command.get_short_help_str(limit=1000) == text, name
    assert sorted(main.commands) == sorted(COMMANDS)  # nothing loaded that the list lacks
