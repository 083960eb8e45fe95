"""Metrics that alert and money that stays private, scraped over HTTP
with the Prometheus parser: forge calls counted around the call, exceptions included;
buckets past the forge timeout; process and build info; every known counter at 0; the
per-client money series behind SAAS_EVAL_METRICS_PER_CLIENT; /metrics behind
SAAS_EVAL_METRICS_TOKEN."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests
from conftest import Receiver, served, settings_on, tasks
from helpers import closed_port, drop, finish_issues
from prometheus_client.parser import text_string_to_metric_families

from dropbox_eval import __version__
from dropbox_eval.app import App, build_app, build_service
from dropbox_eval.config import load_settings
from dropbox_eval.protocol.rejections import REJECTION_REASONS
from dropbox_eval.results.webhooks import WEBHOOK_OUTCOMES
from dropbox_eval.sandbox import SandboxForge

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
METRICS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "metrics.md"


def scrape(url: str, **headers: str) -> Samples:
    answer = requests.get(f"{url}/metrics", headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def calls(samples: Samples, outcome: str) -> float:
    return value(samples, "dropbox_eval_forge_calls_total", outcome=outcome)


def test_a_refused_connection_a_timeout_and_a_5xx_are_counted(
    tmp_path: Path, forge: SandboxForge
) -> None:
    down = build_app(
        load_settings(
            home=tmp_path / "down",
            gitea_url=f"http://127.0.0.1:{closed_port()}",
            gitea_token="t",
            owner="o",
        )
    )
    with served(down) as url:
        assert requests.get(f"{url}/readyz", timeout=30).status_code == 503  # probes /version
        samples = scrape(url)
    assert calls(samples, "connection") == 1 and calls(samples, "2xx") == 0
    version = {"method": "GET", "route": "/api/v1/version"}
    assert value(samples, "dropbox_eval_forge_requests_total", code="connection", **version) == 1
    assert value(samples, "dropbox_eval_forge_request_duration_seconds_count", **version) == 1

    slow = build_app(settings_on(forge, tmp_path / "slow", forge_timeout=0.3))
    forge.set_delay(2.0)
    with served(slow) as url:
        assert requests.get(f"{url}/readyz", timeout=30).status_code == 503
        forge.set_delay(0)
        samples = scrape(url)
    assert calls(samples, "timeout") == 1
    buckets = sorted(
        float(dict(labels)["le"])
        for (name, labels), _ in samples.items()
        if name == "dropbox_eval_forge_request_duration_seconds_bucket"
    )
    assert max(b for b in buckets if b != float("inf")) > 0.3 + 5  # past connect + read timeout

    failing = build_app(settings_on(forge, tmp_path / "failing"))
    forge.fail_next(1, 503, path_contains="/version")
    with served(failing) as url:
        requests.get(f"{url}/readyz", timeout=30)
        samples = scrape(url)
    assert calls(samples, "5xx") == 1
    assert value(samples, "dropbox_eval_forge_requests_total", code="503", **version) == 1


def test_process_build_info_and_no_created_series(app: App) -> None:
    with served(app) as url:
        samples = scrape(url)
    assert value(samples, "process_cpu_seconds_total") > 0
    assert value(samples, "process_resident_memory_bytes") > 0
    info = [labels for (name, labels) in samples if name == "dropbox_eval_build_info"]
    assert len(info) == 1 and dict(info[0])["version"] == __version__
    assert not [name for name, _ in samples if name.endswith("_created")]


def test_every_counter_with_known_labels_starts_at_zero(app: App) -> None:
    with served(app) as url:
        samples = scrape(url)
    for reason in REJECTION_REASONS:
        assert value(samples, "dropbox_eval_files_rejected_total", reason=reason) == 0
    for outcome in ("delivered", "failed"):
        assert value(samples, "dropbox_eval_deliveries_total", outcome=outcome) == 0
    for outcome in ("2xx", "3xx", "4xx", "5xx", "timeout", "connection"):
        assert calls(samples, outcome) == 0
    for outcome in WEBHOOK_OUTCOMES:
        assert value(samples, "dropbox_eval_forge_webhooks_total", outcome=outcome) == 0
    for outcome in ("accepted", "rejected"):
        assert value(samples, "dropbox_eval_drop_to_receipt_seconds_count", outcome=outcome) == 0
    assert value(samples, "dropbox_eval_poll_cycle_duration_seconds_count") == 0
    # the scheduler's budget is known from the start: SAAS_EVAL_INTAKE_CONCURRENCY (4)
    assert value(samples, "dropbox_eval_forge_inflight_limit") == 4


def test_deliveries_drops_and_poll_cycles_are_measured(
    app: App, forge: SandboxForge, funded: str, receiver: Receiver
) -> None:
    drop(app.settings.inbox_path, "good.json", {"tasks": tasks(1)}, funded)
    drop(app.settings.inbox_path, "bad.json", "{nope", funded)
    receiver.answers = [500] * 10
    failing = app.intake.submit_batch(funded, tasks(1), callback_url=receiver.url)["batch_id"]
    to_file = app.intake.submit_batch(funded, tasks(1))["batch_id"]
    for batch_id in (failing, to_file):
        finish_issues(forge, app.store.get_batch(batch_id).repo)
    app, service = build_service(app.settings)  # the service counts in its own parts
    service.run(once=True)
    app.metrics.set_forge_inflight_limit(6)  # what the forge scheduler will call
    with served(app) as url:
        samples = scrape(url)
    assert value(samples, "dropbox_eval_deliveries_total", outcome="delivered") == 1
    assert value(samples, "dropbox_eval_deliveries_total", outcome="failed") == 1
    for outcome in ("accepted", "rejected"):
        assert value(samples, "dropbox_eval_drop_to_receipt_seconds_count", outcome=outcome) == 1
    assert value(samples, "dropbox_eval_poll_cycle_duration_seconds_count") == 1
    assert value(samples, "dropbox_eval_forge_inflight_limit") == 6


def _money(samples: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {key: v for key, v in samples.items() if key[0].startswith("dropbox_eval_credits")}


def test_money_per_client_is_off_unless_the_setting_turns_it_on(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SAAS_EVAL_METRICS_PER_CLIENT", raising=False)
    app = build_app(settings_on(forge, tmp_path, task_price=2))
    app.billing.add_client("acme", 100)
    app.billing.add_client("zeta", 7)
    app.intake.submit_batch("acme", tasks(3))
    with served(app) as url:
        default = _money(scrape(url))
    assert not [labels for (_, labels) in default if any(k == "client" for k, _ in labels)]
    assert value(default, "dropbox_eval_credits_balance") == 107
    assert value(default, "dropbox_eval_credits_held") == 6

    monkeypatch.setenv("SAAS_EVAL_METRICS_PER_CLIENT", "true")
    with served(build_app(settings_on(forge, tmp_path, task_price=2))) as url:
        per_client = _money(scrape(url))
    assert value(per_client, "dropbox_eval_credits_balance", client="acme") == 100
    assert value(per_client, "dropbox_eval_credits_balance", client="zeta") == 7
    assert value(per_client, "dropbox_eval_credits_held", client="acme") == 6
    assert value(per_client, "dropbox_eval_credits_charged_total", client="zeta") == 0


@pytest.mark.parametrize("from_file", [False, True])
def test_metrics_can_require_a_bearer_token(
    tmp_path: Path, forge: SandboxForge, monkeypatch: pytest.MonkeyPatch, from_file: bool
) -> None:
    if from_file:  # a mounted secret, as Prometheus' `credentials_file` reads one
        (tmp_path / "token").write_text("s3cret-token\n")
        monkeypatch.setenv("SAAS_EVAL_METRICS_TOKEN_FILE", str(tmp_path / "token"))
    else:
        monkeypatch.setenv("SAAS_EVAL_METRICS_TOKEN", "s3cret-token")
    app = build_app(settings_on(forge, tmp_path))
    with served(app) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
            refused = requests.get(f"{url}/metrics", headers=headers, timeout=10)
            assert refused.status_code == 401, headers
            assert refused.json()["reason"] == "unauthorized"
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "dropbox_eval" not in refused.text
        samples = scrape(url, Authorization="Bearer s3cret-token")
        assert value(samples, "dropbox_eval_service_running") == 0
        assert requests.get(f"{url}/healthz", timeout=10).status_code == 200  # still open


def test_the_metrics_page_names_every_metric_the_service_exports(app: App) -> None:
    with served(app) as url:
        text = requests.get(f"{url}/metrics", timeout=10).text
    families = {f.name for f in text_string_to_metric_families(text)}
    ours = {name for name in families if name.startswith("dropbox_eval_")}
    page = METRICS_PAGE.read_text(encoding="utf-8")
    documented = set(re.findall(r"`(dropbox_eval_[a-z_]+)`", page))
    missing = {
        name
        for name in ours
        if name not in documented
        and f"{name}_total" not in documented
        and f"{name}_info" not in documented
    }
    assert ours and not missing, missing
