"""The simulated lane's modes and holds, driven in-process and over control routes."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
import requests
from sandbox_client import Api, new_api

from dropbox_eval.errors import ConfigError
from dropbox_eval.sandbox import SandboxForge, SimulatedLane
from dropbox_eval.sandbox.lane_config import LaneConfig
from dropbox_eval.sandbox.options import SandboxOptions

MARKER = re.compile(r"<!-- controller:fingerprint:[0-9a-f]{16} -->")


def _forge(**lane: object) -> SandboxForge:
    """A forge whose lane thread never fires on its own (tests call run_once)."""
    config = LaneConfig(delay=0, interval=3600).with_changes(dict(lane))
    return SandboxForge(port=0, lane=config)


@pytest.fixture
def pulls_forge() -> Iterator[SandboxForge]:
    with _forge(mode="pulls", merge_delay=10) as running:
        yield running


def _lane(forge: SandboxForge) -> SimulatedLane:
    assert forge.lane is not None
    return forge.lane


def _task(api: Api, title: str = "Task", body: str = "") -> int:
    labels = [lb["id"] for lb in api.get("/labels").json() if lb["name"] == "eval-task"]
    return api.issue(title, body=body, labels=labels or [api.label("eval-task")])


def _types(api: Api, number: int) -> list[str]:
    return [f"{e['type']}:{e['user']['login']}" for e in api.timeline(number)]


def test_pulls_mode_merges_a_pull_request_that_closes_the_issue(
    pulls_forge: SandboxForge,
) -> None:
    api, lane = new_api(pulls_forge), _lane(pulls_forge)
    number = _task(api)
    now = time.time()
    assert lane.run_once(now) == 1  # picked up: status comment + PR, not merged yet
    status = api.timeline(number)[1]
    assert status["type"] == "comment" and MARKER.search(status["body"])
    pull = api.get("/pulls").json()[0]
    assert pull["body"].startswith(f"Closes #{number}") and pull["user"]["login"] == "lane-bot"
    assert api.get(f"/issues/{number}").json()["state"] == "open"
    assert lane.run_once(now + 5) == 0
    assert lane.run_once(now + 11) == 1
    assert _types(api, number) == [
        "label:eval",
        "comment:lane-bot",
        "pull_ref:lane-bot",
        "comment:lane-bot",
        "label:lane-bot",
        "close:lane-bot",
    ]
    entries = api.timeline(number)
    assert (
        entries[2]["ref_action"] == "closes"
        and entries[2]["ref_issue"]["number"] == (pull["number"])
    )
    assert entries[3]["body"].startswith("Lane verdict: PASS") and MARKER.search(entries[3]["body"])
    assert entries[4]["label"]["name"] == "eval-pass"
    merged = api.get(f"/pulls/{pull['number']}").json()
    assert merged["merged"] is True and re.fullmatch(r"[0-9a-f]{40}", merged["merge_commit_sha"])
    assert lane.run_once(now + 100) == 0  # nothing left to do


def test_pulls_mode_abandons_with_ratio_zero_or_fail_marker() -> None:
    with _forge(mode="pulls", merge_ratio=0.0) as forge:
        api = new_api(forge)
        number = _task(api)
        _lane(forge).run_once()
        pull = api.get("/pulls", state="all").json()[0]
        assert pull["state"] == "closed" and pull["merged"] is False
        assert pull["merge_commit_sha"] is None
        issue = api.get(f"/issues/{number}").json()
        assert issue["state"] == "closed" and "eval-fail" in [lb["name"] for lb in issue["labels"]]
        assert _types(api, number)[-1] == "close:lane-bot"
        assert _types(api, pull["number"]) == ["close:lane-bot"]
        forge.lane.configure(merge_ratio=1.0)  # type: ignore[union-attr]
        failing = _task(api, body="please lane:fail")
        _lane(forge).run_once()
        pulls = api.get("/pulls", state="all").json()
        assert pulls[0]["merged"] is False and api.get(f"/issues/{failing}").json()["state"] == (
            "closed"
        )


def test_close_first_then_label_and_comment_later() -> None:
    with _forge(mode="pulls", close_first=True, comment_lag=30) as forge:
        api, lane = new_api(forge), _lane(forge)
        number = _task(api)
        now = time.time()
        assert lane.run_once(now) == 2  # merge_delay 0: picked up, then merged, one pass
        assert api.get(f"/issues/{number}").json()["state"] == "closed"
        assert _types(api, number)[-1] == "close:lane-bot"
        assert [lb["name"] for lb in api.get(f"/issues/{number}").json()["labels"]] == ["eval-task"]
        assert lane.run_once(now + 29) == 0
        assert lane.run_once(now + 31) == 1
        assert _types(api, number)[-3:] == ["close:lane-bot", "comment:lane-bot", "label:lane-bot"]


def test_merge_draw_is_reproducible_with_a_seed() -> None:
    outcomes = []
    for _ in range(2):
        with _forge(mode="pulls", merge_ratio=0.5, seed=7) as forge:
            api = new_api(forge)
            for i in range(12):
                _task(api, f"t{i}")
            _lane(forge).run_once()
            outcomes.append([p["merged"] for p in api.get("/pulls", state="all").json()])
    assert outcomes[0] == outcomes[1] and True in outcomes[0] and False in outcomes[0]


def test_holds_and_releases_over_control_routes() -> None:
    config = LaneConfig(delay=0, interval=3600)
    with SandboxForge(port=0, lane=config, hold_lane=True) as forge:
        control = f"{forge.url}/_sandbox/lane"
        one, two = new_api(forge), new_api(forge)
        keep, close = _task(one, "keep"), _task(one, "close")
        other = _task(two, "other repo")
        assert requests.post(f"{control}/run", timeout=30).json() == {"actions": 0}
        released = requests.post(
            f"{control}/release",
            timeout=30,
            json={"owner": one.owner, "repo": one.repo, "number": close},
        )
        assert released.status_code == 200
        requests.post(f"{control}/release", json={"owner": two.owner, "repo": two.repo}, timeout=30)
        assert requests.post(f"{control}/run", timeout=30).json() == {"actions": 2}
        states = {n: one.get(f"/issues/{n}").json()["state"] for n in (keep, close)}
        assert states == {keep: "open", close: "closed"}
        assert two.get(f"/issues/{other}").json()["state"] == "closed"
        shown = requests.get(control, timeout=30).json()
        assert shown["holds"]["all"] is True and len(shown["holds"]["rules"]) == 2
        requests.post(f"{control}/hold", json={}, timeout=30)
        requests.post(f"{control}/release", json={"owner": one.owner, "repo": one.repo}, timeout=30)
        assert requests.post(f"{control}/run", timeout=30).json() == {"actions": 1}


def test_control_route_reconfigures_and_validates(pulls_forge: SandboxForge) -> None:
    control = f"{pulls_forge.url}/_sandbox/lane"
    changed = requests.patch(control, json={"mode": "labels", "delay": 1.5}, timeout=30)
    assert changed.status_code == 200
    assert changed.json()["config"]["mode"] == "labels" and _lane(pulls_forge).delay == 1.5
    for bad in ({"mode": "yolo"}, {"merge_ratio": 2}, {"nope": 1}):
        response = requests.patch(control, json=bad, timeout=30)
        assert response.status_code == 422 and response.json()["message"]
    with SandboxForge(port=0) as laneless:
        assert requests.get(f"{laneless.url}/_sandbox/lane", timeout=30).status_code == 409


def test_labels_mode_still_closes_with_verdict_events_and_respects_holds() -> None:
    with _forge() as forge:
        api, lane = new_api(forge), _lane(forge)
        held, free = _task(api, "held"), _task(api, "free")
        lane.gate.hold(api.owner, api.repo, held)
        assert lane.run_once() == 1
        assert _types(api, free)[-3:] == ["comment:lane-bot", "label:lane-bot", "close:lane-bot"]
        assert api.get(f"/issues/{held}").json()["state"] == "open"


def test_options_from_env_mapping_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    options = SandboxOptions.from_env(
        {
            "SANDBOX_LANE_MODE": "pulls",
            "SANDBOX_FLAVOR": "forgejo",
            "SANDBOX_REPO_QUOTA": "4",
            "SANDBOX_MERGE_RATIO": "0.25",
            "SANDBOX_CLOSE_FIRST": "true",
            "PATH": "/bin",
        }
    )
    assert (options.lane_mode, options.flavor, options.repo_quota) == ("pulls", "forgejo", 4)
    config = options.lane_config(delay=3)
    assert (config.mode, config.delay, config.merge_ratio, config.close_first) == (
        "pulls",
        3,
        0.25,
        True,
    )
    with pytest.raises(ConfigError, match="SANDBOX_MERGE_RATIO"):
        SandboxOptions.from_env({"SANDBOX_MERGE_RATIO": "1.5"})
    with pytest.raises(ConfigError, match="SANDBOX_LANE_MODE"):
        SandboxOptions.from_env({"SANDBOX_LANE_MODE": "yolo"})
    monkeypatch.setenv("SANDBOX_LANE_MODE", "pulls")
    monkeypatch.setenv("SANDBOX_FLAVOR", "forgejo")
    forge = SandboxForge.from_env(lane_delay=2)
    assert forge.state.flavor.name == "forgejo"
    assert forge.lane is not None and forge.lane.config.mode == "pulls"
    assert SandboxForge.from_env().lane is None
