"""The forge's wire format: the JSON it answers (issues, timelines, pull requests), its
timestamps and headers, and HTTP statuses translated into the project's errors (used by
forge.py only)."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ValidationError

from ..errors import ForgeAuthError, ForgeError, ForgeNotFound, ForgePermanent, ForgeRetryable
from ..util.redact import shown_url

if TYPE_CHECKING:  # only answers are read here: `status` and the views need no HTTP client
    import requests

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _as_utc(moment: datetime) -> datetime:
    """Aware UTC; a forge (or proxy) timestamp without an offset is taken as UTC."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


class ForgeIssue(BaseModel):
    """The parts of a Gitea issue this product reads."""

    number: int
    title: str
    body: str = ""
    state: str
    labels: list[str]
    html_url: str
    updated_at: UtcDatetime
    closed_at: UtcDatetime | None = None
    comments: int = 0
    repo: str = ""  # `owner/name`, from the `repository` of a cross-repo search


class ForgeRefPull(BaseModel):
    """`pull_request` of an issue that is a pull request (live merge state)."""

    merged: bool = False
    merged_at: UtcDatetime | None = None
    html_url: str = ""


class ForgeRepoName(BaseModel):
    """`repository` of an issue: where it lives."""

    full_name: str = ""


class ForgeRefIssue(BaseModel):
    """`ref_issue` of a timeline entry: the referencing issue or pull request, and the repo
    it lives in (another repo for `Closes owner/name#N`)."""

    number: int
    html_url: str = ""
    state: str = ""
    pull_request: ForgeRefPull | None = None
    repository: ForgeRepoName | None = None

    @property
    def repo(self) -> str:
        """`owner/name` of the referencing issue's repo ("" when the forge did not say)."""
        return self.repository.full_name if self.repository is not None else ""


class ForgeUser(BaseModel):
    """Who wrote a timeline entry."""

    login: str = ""


class ForgeEntryLabel(BaseModel):
    """`label` of a timeline `label` entry (null when the label was deleted since)."""

    name: str = ""


class ForgeTimelineEntry(BaseModel):
    """One entry of an issue's timeline (Gitea's `TimelineComment`): `comment`, `label`,
    `pull_ref`, `close`, `reopen`, ... (unknown types are kept and ignored). `updated_at`
    moves when a comment is edited (the issue's does not); `ref_commit_sha` is the commit
    that closed or reopened the issue (a merge), empty for a close by hand."""

    id: int
    type: str
    body: str | None = ""
    user: ForgeUser | None = None
    created_at: UtcDatetime
    updated_at: UtcDatetime | None = None
    ref_action: str | None = "none"
    ref_commit_sha: str | None = ""
    ref_issue: ForgeRefIssue | None = None
    label: ForgeEntryLabel | None = None  # a `label` entry's label; body "1" added, "" removed

    @property
    def login(self) -> str:
        """Who wrote it ("" when the forge did not say)."""
        return self.user.login if self.user is not None else ""

    @property
    def changed_at(self) -> datetime:
        """When the entry last changed: created, or edited since."""
        return max(self.created_at, self.updated_at or self.created_at)


class ForgePull(BaseModel):
    """The parts of a Gitea pull request this product reads."""

    number: int
    html_url: str
    state: str
    merged: bool = False
    merged_at: UtcDatetime | None = None
    merge_commit_sha: str | None = None
    additions: int | None = None
    deletions: int | None = None
    changed_files: int | None = None


def covers(entries: list[ForgeTimelineEntry], issue: ForgeIssue) -> bool:
    """Whether timeline entries read so far account for the issue as listed: every comment
    it counts, and a change as recent as its `updated_at` (every new entry moves it)."""
    comments = sum(1 for entry in entries if entry.type == "comment")
    newest = max((entry.created_at for entry in entries), default=None)
    return comments >= issue.comments and newest is not None and newest >= issue.updated_at


Model = TypeVar("Model", bound=BaseModel)


def parse_model(model: type[Model], data: Any, what: str) -> Model:
    """`data` as `model`; ForgePermanent naming `what` when it does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ForgePermanent(f"unexpected {what} JSON from forge: {exc}") from exc


def parse_issue(data: Any) -> ForgeIssue:
    """A ForgeIssue from the forge's JSON (label objects become their names)."""
    try:
        labels = [str(label["name"]) for label in data.get("labels") or []]
        repo = (data.get("repository") or {}).get("full_name") or ""
        return ForgeIssue.model_validate({**data, "labels": labels, "repo": repo})
    except (AttributeError, KeyError, TypeError, ValidationError) as exc:
        raise ForgePermanent(f"unexpected issue JSON from forge: {exc}") from exc


def json_body(response: requests.Response) -> Any:
    """The JSON body (None when empty); ForgePermanent when it is not JSON."""
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise ForgePermanent(
            f"{response.request.method} {shown_url(response.url)}: forge sent non-JSON "
            f"({response.headers.get('Content-Type', '?')})",
            response.status_code,
        ) from exc


def status_error(method: str, path: str, response: requests.Response) -> ForgeError:
    """The project's error for an HTTP error status."""
    status = response.status_code
    message = f"{method} {path}: HTTP {status} {_message(response)}".rstrip()
    if status in RETRYABLE_STATUSES:
        return ForgeRetryable(message, status, retry_after(response))
    if status == 401:
        return ForgeAuthError(f"{message} (check SAAS_EVAL_GITEA_TOKEN)", status)
    if status == 403:
        return ForgeAuthError(f"{message} (the token lacks a permission or scope)", status)
    if status == 404:
        return ForgeNotFound(message, status)
    return ForgePermanent(message, status, method)


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return ""


def rfc3339(moment: datetime) -> str:
    """`moment` as RFC 3339 UTC with whole seconds, the form Gitea's `since` parses; a
    naive datetime is taken as UTC (never sent without an offset)."""
    return _as_utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def server_time(response: requests.Response) -> datetime | None:
    """The forge's clock from `Date`, aware UTC; None when absent, repeated (a proxy added
    one: requests joins them with ", "), zone-less (`-0000`) or unparsable."""
    value = response.headers.get("Date")
    if not value or value.count(",") > 1:
        return None
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return moment.astimezone(UTC)


def retry_after(response: requests.Response) -> float | None:
    """The `Retry-After` hint in seconds, if it is a number."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
