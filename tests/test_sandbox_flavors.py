"""Gitea and Forgejo flavours of the sandbox differ where the real forges differ."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from sandbox_client import Api, new_api, session

from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sandbox.flavor import Flavor, cut_bytes, cut_display

CJK = "漢" * 200


@pytest.fixture(scope="module")
def gitea() -> Iterator[SandboxForge]:
    with SandboxForge(port=0) as running:
        yield running


@pytest.fixture(scope="module")
def forgejo() -> Iterator[SandboxForge]:
    with SandboxForge(port=0, flavor="forgejo") as running:
        yield running


def _title(api: Api, title: str) -> str:
    response = api.post("/issues", {"title": title})
    assert response.status_code == 201, response.text
    return str(response.json()["title"])


def test_gitea_cuts_titles_by_display_width(gitea: SandboxForge) -> None:
    api = new_api(gitea)
    assert _title(api, CJK) == "漢" * 126 + "…"
    assert _title(api, "x" * 300) == "x" * 252 + "…"
    assert _title(api, "x" * 255) == "x" * 255
    assert _title(api, "漢" * 100) == "漢" * 100  # 300 bytes but only 200 columns
    assert _title(api, "x" * 250 + "漢" * 3) == "x" * 250 + "漢" + "…"  # 2 left: 256 > 255


def test_forgejo_cuts_titles_by_bytes(forgejo: SandboxForge) -> None:
    api = new_api(forgejo)
    assert _title(api, CJK) == "漢" * 84 + "…"  # 252 bytes + 3-byte ellipsis
    assert _title(api, "x" * 300) == "x" * 252 + "…"
    assert len(_title(api, "é" * 200).encode()) <= 255


def test_cut_helpers_edge_cases() -> None:
    assert cut_display("漢" * 126 + "xyz", 255) == "漢" * 126 + "xyz"  # 3 runes left fit
    assert cut_display("漢" * 126 + "wxyz", 255) == "漢" * 126 + "…"  # 4 runes left
    assert cut_display("a" * 254 + "bcd", 255) == "a" * 252 + "…"
    assert cut_bytes("ab", 255) == "ab"
    assert Flavor("gitea").cut_title("漢" * 127) == "漢" * 127  # 254 columns fit


@pytest.mark.parametrize(
    ("flavor", "scheme", "status"),
    [
        ("gitea", "token", 200),
        ("gitea", "Token", 200),
        ("gitea", "BEARER", 200),
        ("forgejo", "token", 200),
        ("forgejo", "Token", 401),
        ("forgejo", "TOKEN", 401),
        ("forgejo", "Bearer", 200),
        ("forgejo", "bearer", 200),
    ],
)
def test_auth_scheme_case(
    flavor: str, scheme: str, status: int, request: pytest.FixtureRequest
) -> None:
    forge: SandboxForge = request.getfixturevalue(flavor)
    response = session(forge.token, scheme).get(f"{forge.url}/api/v1/user", timeout=30)
    assert response.status_code == status


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a..b", "name is invalid [a..b]"),
        ("..", "name is reserved [name: ..]"),
        ("x.git", "name pattern is not allowed [pattern: *.git]"),
        ("X.Wiki", "name pattern is not allowed [pattern: *.wiki]"),
        ("-", "name is reserved"),
        ("bad name", "[Name]: AlphaDashDot"),
    ],
)
def test_refused_repo_names(gitea: SandboxForge, name: str, message: str) -> None:
    response = session(gitea.token).post(
        f"{gitea.url}/api/v1/user/repos", json={"name": name}, timeout=30
    )
    assert response.status_code == 422
    assert response.json()["message"].startswith(message)


def test_forgejo_repo_quota_413_and_gitea_has_none(gitea: SandboxForge) -> None:
    with SandboxForge(port=0, flavor="forgejo", repo_quota=2) as forgejo:
        made = session(forgejo.token)
        statuses = [
            made.post(f"{forgejo.url}/api/v1/user/repos", json={"name": f"q{i}"}, timeout=30)
            for i in range(3)
        ]
        assert [r.status_code for r in statuses] == [201, 201, 413]
        assert statuses[-1].json()["message"] == "quota exceeded"
        assert statuses[-1].json()["username"] == forgejo.user
        org = made.post(f"{forgejo.url}/api/v1/orgs/evalorg/repos", json={"name": "q"}, timeout=30)
        assert org.status_code == 201  # the quota is per owner
    for i in range(3):
        plain = session(gitea.token).post(
            f"{gitea.url}/api/v1/user/repos", json={"name": f"many{i}"}, timeout=30
        )
        assert plain.status_code == 201


def test_versions_and_missing_issue_comments(gitea: SandboxForge, forgejo: SandboxForge) -> None:
    assert requests.get(f"{gitea.url}/api/v1/version", timeout=30).json()["version"] == (
        "1.22.0+sandbox"
    )
    version = requests.get(f"{forgejo.url}/api/v1/version", timeout=30).json()["version"]
    assert "+gitea-1.22.0" in version
    assert new_api(gitea).get("/issues/999/comments").status_code == 500
    assert new_api(forgejo).get("/issues/999/comments").status_code == 404
