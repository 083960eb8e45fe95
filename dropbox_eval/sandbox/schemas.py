"""Request bodies of the sandbox API and their Gitea-style (422) validation."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from .errors import SandboxApiError

_GO_TYPES = {
    "int_type": "int64",
    "string_type": "string",
    "bool_type": "bool",
    "list_type": "array",
    "model_type": "object",
    "dict_type": "object",
}
_JSON_TYPES = {
    str: "string",
    int: "number",
    float: "number",
    bool: "bool",
    list: "array",
    dict: "object",
    type(None): "null",
}


class _Option(BaseModel):
    """Strict like Go's JSON decoding: no string->int or int->string coercion."""

    model_config = ConfigDict(strict=True)


class CreateRepoOption(_Option):
    """Body of `POST /user/repos` and `POST /orgs/{org}/repos`."""

    name: str
    description: str | None = None
    private: bool | None = None
    auto_init: bool | None = None


class CreateLabelOption(_Option):
    """Body of `POST /repos/{o}/{r}/labels`."""

    name: str
    color: str
    description: str | None = None


class CreateIssueOption(_Option):
    """Body of `POST /repos/{o}/{r}/issues` (labels are ids only, like Gitea)."""

    title: str = ""
    body: str | None = None
    labels: list[int] | None = None
    assignees: list[str] | None = None
    assignee: str | None = None
    closed: bool | None = None


class EditIssueOption(_Option):
    """Body of `PATCH /repos/{o}/{r}/issues/{n}`."""

    title: str | None = None
    body: str | None = None
    state: str | None = None


class CreateCommentOption(_Option):
    """Body of `POST /repos/{o}/{r}/issues/{n}/comments` (and of a comment edit, Gitea's
    `EditIssueCommentOption`)."""

    body: str = ""


class EditRepoOption(_Option):
    """Body of `PATCH /repos/{o}/{r}` (the fields the sandbox acts on)."""

    name: str | None = None
    description: str | None = None
    archived: bool | None = None


class TransferRepoOption(_Option):
    """Body of `POST /repos/{o}/{r}/transfer` (`team_ids` accepted, not acted on)."""

    new_owner: str
    team_ids: list[int] | None = None


class EditLabelOption(_Option):
    """Body of `PATCH /repos/{o}/{r}/labels/{id}`."""

    name: str | None = None
    color: str | None = None
    description: str | None = None


class IssueLabelsOption(_Option):
    """Body of `POST /repos/{o}/{r}/issues/{n}/labels`: ids or names."""

    labels: list[Any] | None = None


class CreatePullRequestOption(_Option):
    """Body of `POST /repos/{o}/{r}/pulls`."""

    head: str = ""
    base: str = ""
    title: str = ""
    body: str | None = None


class EditPullRequestOption(_Option):
    """Body of `PATCH /repos/{o}/{r}/pulls/{n}`."""

    title: str | None = None
    body: str | None = None
    state: str | None = None


class MergePullRequestOption(_Option):
    """Body of `POST /repos/{o}/{r}/pulls/{n}/merge`; Go matches `Do`/`do` either way."""

    do: str | None = Field(None, validation_alias=AliasChoices("Do", "do", "DO"))


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], raw: bytes) -> M:
    """Decode and validate a JSON body; an empty body counts as `{}` (like Gitea)."""
    try:
        data = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise SandboxApiError(422, f"[]: Deserialization: {exc}") from None
    if not isinstance(data, dict):
        raise SandboxApiError(422, f"[]: json: cannot unmarshal {_json_type(data)} into Go value")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SandboxApiError(422, gitea_message(model.__name__, exc.errors())) from None


def gitea_message(model: str, errors: Any) -> str:
    """Turn the first pydantic error into Gitea's `"[Field]: Required"` style message."""
    if not errors:
        return "[]: invalid request"
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = loc[0] if loc else ""
    if first.get("type") == "missing":
        return f"[{_camel(field)}]: Required"
    go_type = _GO_TYPES.get(str(first.get("type")), "value")
    source = _json_type(first.get("input"))
    return (
        f"[]: json: cannot unmarshal {source} into Go struct field {model}.{field}"
        f" of type {go_type}"
    )


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), "value")


class CreateHookOptionConfig(_Option):
    """`config` of `CreateHookOption` (Gitea takes a string map)."""

    url: str
    content_type: str = "json"
    secret: str = ""


class CreateHookOption(_Option):
    """Body of `POST .../hooks`."""

    type: str
    config: CreateHookOptionConfig
    events: list[str] | None = None
    active: bool = False
    branch_filter: str | None = None
    authorization_header: str | None = None
