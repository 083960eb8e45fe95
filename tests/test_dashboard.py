"""`deploy/grafana-dashboard.json` against the real service's `/metrics`: every
metric a panel's (or a variable's) PromQL names is one the service exposes, with the
suffix it is exposed under (`_total`, `_bucket`, ...), and every `dropbox_eval_` metric is on
some panel. The service runs as `dropbox-eval run --sandbox --http-port 0` and handles one
batch first, so the series that exist only once something happened (forge calls by route)
are there. Each expression also parses with `promtool check rules` when promtool is there
(`.ci/run` installs it; CI=true without it fails, as in test_alerts.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import PATIENCE, tasks, wait_for
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana-dashboard.json"
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_MODIFIERS = re.compile(r"\boffset\s+-?[0-9a-zA-Z$_]+|@\s*[^\s()]+")
_NUMBERS = re.compile(r"(?<![\w:.])(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan", "atan2"}
_HISTOGRAM = ("_bucket", "_count", "_sum")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges, grouping clauses, modifiers and numbers are taken out, that are
    neither a keyword nor a function or aggregation (followed by `(`)."""
    text = _STRINGS.sub('""', expr)
    for pattern in (_MATCHERS, _RANGES, _GROUPING, _MODIFIERS, _NUMBERS):
        text = pattern.sub(" ", text)
    names = set()
    for found in _IDENTIFIER.finditer(text):
        rest = text[found.end() :].lstrip()
        if found[0].lower() not in _KEYWORDS and not rest.startswith("("):
            names.add(found[0])
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expression) for every panel target and query variable."""
    board: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert inner, variable
            queries.append((f"variable {variable['name']!r}", inner[1]))
    return queries


def test_metric_names_are_read_out_of_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, route) (rate(a_bucket{job=~"x|y", r="{b}"}[5m])))'
    ) == {"a_bucket"}
    assert metric_names("sum without (instance) (b_total offset 1h) / on(job) c @ 1609746000") == {
        "b_total",
        "c",
    }
    assert metric_names("time() - d > bool 1e3 and e unless f[5m:1m] or Inf") == {"d", "e", "f"}
    assert metric_names('topk(10, sum(rate(g{code=~"4..|sum(x)"}[$__rate_interval])))') == {"g"}
    assert metric_names("h:recorded_rate5m * 0x1F + .5") == {"h:recorded_rate5m"}


def test_the_dashboard_has_the_panels_the_issue_asks_for() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    for wanted in ("intake", "Forge calls and errors", "Scheduler", "Results", "Deliveries"):
        assert any(wanted.lower() in row.lower() for row in rows), (wanted, rows)
    assert "Credits" in rows
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()  # no two panels overlap on Grafana's 24-wide grid
    for panel in board["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        taken = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not taken & cells, panel["title"]
        cells |= taken
    for where, expr in dashboard_queries():
        assert metric_names(expr), f"{where} names no metric: {expr}"


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Sample names of the real service's /metrics, after one batch went through."""
    home = tmp_path_factory.mktemp("dashboard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env.update(
        SAAS_EVAL_POLL_INTERVAL="0.3", SAAS_EVAL_QUIET_PERIOD="0.2", SAAS_EVAL_SETTLE_SECONDS="0"
    )
    base = [sys.executable, "-m", "dropbox_eval", "--home", str(home)]
    added = subprocess.run(
        [*base, "clients", "add", "acme", "--credits", "10"], env=env, capture_output=True
    )
    assert added.returncode == 0, added.stderr
    service = subprocess.Popen(
        [*base, "run", "--sandbox", "--lane-delay", "0.3", "--http-port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    assert service.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(service.stderr or []), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("operator page at " in line for line in lines)), lines
        url = next(line for line in lines if "operator page at " in line).split()[-1]
        url = url.removesuffix("/operator")
        (home / "inbox" / "acme").mkdir(parents=True, exist_ok=True)
        drop = home / "inbox" / "acme" / "one.json.part"
        drop.write_text(json.dumps({"tasks": tasks(2)}), encoding="utf-8")
        drop.rename(drop.with_suffix(""))
        assert wait_for(lambda: any((home / "outbox").glob("*.json"))), lines
        answer = requests.get(f"{url}/metrics", timeout=PATIENCE)
        assert answer.status_code == 200, answer.text
        yield {
            sample.name
            for family in text_string_to_metric_families(answer.text)
            for sample in family.samples
        }
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=PATIENCE)
        reader.join(timeout=PATIENCE)


def test_every_metric_a_panel_names_is_exposed(exposed: set[str]) -> None:
    assert "dropbox_eval_forge_requests_total" in exposed  # the batch made forge calls
    missing = [
        (where, name)
        for where, expr in dashboard_queries()
        for name in sorted(metric_names(expr))
        if name not in exposed
    ]
    assert missing == []


def test_every_dropbox_eval_metric_is_on_the_dashboard(exposed: set[str]) -> None:
    def family(name: str) -> str:
        for suffix in _HISTOGRAM:
            if name.endswith(suffix):
                return name.removesuffix(suffix)
        return name

    shown = {family(name) for _, expr in dashboard_queries() for name in metric_names(expr)}
    ours = {family(name) for name in exposed if name.startswith("dropbox_eval_")}
    assert ours - shown == set()


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        missing = "promtool is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must check the dashboard's queries: {missing}")
        pytest.skip(missing)
    rules = [
        {"record": f"dashboard:query{index}", "expr": expr}
        for index, (_, expr) in enumerate(dashboard_queries())
    ]
    document = {"groups": [{"name": "dashboard", "rules": rules}]}
    (tmp_path / "dashboard.yml").write_text(json.dumps(document), encoding="utf-8")  # JSON is YAML
    checked = subprocess.run(
        [tool, "check", "rules", "dashboard.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout
