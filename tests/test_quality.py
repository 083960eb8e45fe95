"""Lint and strict typing are part of the test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    paths = [p for p in ("dropbox_eval", "tests", "bench", "examples") if (ROOT / p).exists()]
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", *paths], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    paths = [p for p in ("dropbox_eval", "tests", "bench", "examples") if (ROOT / p).exists()]
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


IMPORT_ALL = """
import importlib, pathlib, sys
sys.path.insert(0, sys.argv[1])
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
    importlib.import_module(path.stem)  # an import error names the script
"""


def test_every_bench_script_still_imports() -> None:
    """A renamed function breaks a benchmark nobody runs in the suite: import them all."""
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(ROOT / "bench")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
