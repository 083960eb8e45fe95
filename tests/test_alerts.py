"""The documented alert rules, tested with `promtool test rules` (Debian's `prometheus`).

The rules are read from the "Alerts" block of docs/reference/metrics.md itself (the one copy
operators paste);
`tests/data/alerts_test.yml` feeds each alert a synthetic series it must fire on and one it
must stay quiet on. Without promtool the test is skipped with the reason, except under
CI=true, where that is a failure (`.ci/run` installs the package).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "data" / "alerts_test.yml"


def documented_rules() -> str:
    """The yaml block of the "## Alerts" section of the metrics reference page."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    section = page[page.index("\n## Alerts\n") :]
    found = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert found, "the metrics page's Alerts section has no yaml block"
    return found.group(1)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing = "promtool is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must test the alert rules: {missing}")
        pytest.skip(missing)
    return found


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_every_alert_fires_on_its_case_and_stays_quiet_on_another(tmp_path: Path) -> None:
    tool = promtool()
    (tmp_path / "alerts.yml").write_text(documented_rules(), encoding="utf-8")
    shutil.copy(CASES, tmp_path / "alerts_test.yml")
    checked = _run(tool, "check", "rules", "alerts.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _run(tool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = set(re.findall(r"- alert: (\w+)", documented_rules()))
    tested_alerts = set(re.findall(r"alertname: (\w+)", CASES.read_text(encoding="utf-8")))
    assert alerts == tested_alerts  # no alert without its case


def test_a_rule_that_cannot_fire_fails_the_test(tmp_path: Path) -> None:
    """The harness catches an alert that never fires (the issue's `> 10` on a histogram
    whose buckets stopped at 10 s): the forge-slow case against buckets capped there."""
    tool = promtool()
    capped = documented_rules().replace("> 10\n", "> 40\n", 1)  # above every bucket of the case
    assert capped != documented_rules()
    (tmp_path / "alerts.yml").write_text(capped, encoding="utf-8")
    shutil.copy(CASES, tmp_path / "alerts_test.yml")
    tested = _run(tool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode != 0 and "DropboxEvalForgeSlow" in tested.stdout + tested.stderr
