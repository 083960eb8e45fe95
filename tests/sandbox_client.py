"""Helpers for the sandbox tests: a token session bound to one fresh repo, schema checks."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import requests

from dropbox_eval.sandbox import SandboxForge

DEFINITIONS = Path(__file__).parent / "data" / "gitea_swagger_definitions.json"
_names = itertools.count(1)


@dataclass
class Api:
    """A token-authenticated session bound to one repo of a running forge."""

    forge: SandboxForge
    session: requests.Session
    owner: str
    repo: str

    @property
    def base(self) -> str:
        return f"{self.forge.url}/api/v1"

    @property
    def repo_url(self) -> str:
        return f"{self.base}/repos/{self.owner}/{self.repo}"

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.session.get(self.repo_url + path, params=params, timeout=30)

    def post(self, path: str, body: Any) -> requests.Response:
        return self.session.post(self.repo_url + path, json=body, timeout=30)

    def patch(self, path: str, body: Any) -> requests.Response:
        return self.session.patch(self.repo_url + path, json=body, timeout=30)

    def label(self, name: str, color: str = "ff0000") -> int:
        response = self.post("/labels", {"name": name, "color": color})
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def issue(self, title: str = "task", body: str = "", labels: list[int] | None = None) -> int:
        response = self.post("/issues", {"title": title, "body": body, "labels": labels or []})
        assert response.status_code == 201, response.text
        return int(response.json()["number"])

    def pull(self, body: str, head: str | None = None, title: str = "change") -> dict[str, Any]:
        head = head or f"feature-{next(_names)}"
        response = self.post("/pulls", {"head": head, "base": "main", "title": title, "body": body})
        assert response.status_code == 201, response.text
        data: dict[str, Any] = response.json()
        return data

    def timeline(self, number: int, **params: Any) -> list[dict[str, Any]]:
        response = self.get(f"/issues/{number}/timeline", **params)
        assert response.status_code == 200, response.text
        data: list[dict[str, Any]] = response.json()
        return data


def session(token: str, scheme: str = "token") -> requests.Session:
    """A requests session sending `Authorization: <scheme> <token>`."""
    made = requests.Session()
    made.headers["Authorization"] = f"{scheme} {token}"
    return made


def new_api(forge: SandboxForge) -> Api:
    """A fresh repo in the forge user's namespace, with faults and the request log reset."""
    forge.state.faults.clear()
    forge.clear_requests()
    made = session(forge.token)
    name = f"repo{next(_names)}"
    created = made.post(f"{forge.url}/api/v1/user/repos", json={"name": name}, timeout=30)
    assert created.status_code == 201, created.text
    return Api(forge, made, forge.user, name)


def _without_nulls(value: Any) -> Any:
    """Go renders nil pointers as null where the swagger schema names an object."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _closed(node: Any) -> Any:
    """The schema with `additionalProperties: false` on every object: no invented fields."""
    if isinstance(node, dict):
        closed = {k: _closed(v) for k, v in node.items()}
        if "properties" in closed:
            closed["additionalProperties"] = False
        return closed
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


@cache
def _validator(definition: str) -> Any:
    definitions = json.loads(DEFINITIONS.read_text(encoding="utf-8"))["definitions"]
    # Gitea's User.MarshalJSON adds "username" (GitHub compatibility); swagger omits it.
    definitions["User"]["properties"]["username"] = {"type": "string"}
    schema = {"$ref": f"#/definitions/{definition}", "definitions": _closed(definitions)}
    return jsonschema_rs.Draft4Validator(schema, validate_formats=True)


def schema_errors(definition: str, data: Any) -> list[str]:
    """Why `data` is not a valid Gitea `definition` object (empty when it is)."""
    return [
        f"{e.instance_path}: {e.message}"
        for e in _validator(definition).iter_errors(_without_nulls(data))
    ]
