"""The documents a drop gets back: the receipt of an accepted batch or cancel request, and
the error file of a rejected drop (README "File protocol"). Each is built only through
these models, and the JSON Schemas clients get (`dropbox-eval schema`) are generated from
them, so what is written and what is published cannot drift apart.

A field marked optional in `OMITTED` is left out of the document while empty, as it always
was: `duplicate` only when true, `failure` only when there is one, a rejection's details
only when they apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ..models import BatchStatus
from .rejections import RejectionReason

Timestamp = Annotated[
    str,
    Field(
        pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$",
        json_schema_extra={"format": "date-time"},
        description="RFC 3339, UTC, whole seconds: 2026-12-01T04:08:47Z",
    ),
]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the drop")]


class Document(BaseModel):
    """A document written for a client: no field it does not declare."""

    model_config = ConfigDict(extra="forbid")
    OMITTED: ClassVar[tuple[str, ...]] = ()
    _issues: list[dict[str, Any]] | None = PrivateAttr(default=None)

    @classmethod
    def with_issues(cls, issues: list[dict[str, Any]], **fields: Any) -> Self:
        """The document validated but for its `issues`, kept as given (`issue_list`'s
        plain IssueNumber documents): a big batch has 100,000, and a model each would
        double the receipt's memory for nothing a str and an int do not already say."""
        made = cls.model_validate({**fields, "issues": []})
        made._issues = issues
        return made

    def document(self) -> dict[str, Any]:
        """JSON-ready, without the optional fields that are empty."""
        data: dict[str, Any] = self.model_dump(mode="json")
        if self._issues is not None:
            data["issues"] = self._issues
        for name in self.OMITTED:
            if data.get(name) is None or data.get(name) is False:
                data.pop(name, None)
        return data


class IssueNumber(Document):
    """One task's issue so far (null until it is created)."""

    task_id: str
    issue_number: int | None


def issue_list(numbers: Mapping[str, int | None]) -> list[dict[str, Any]]:
    """task_id -> issue number (None: none yet) as a document's `issues`, in order."""
    return [{"task_id": task_id, "issue_number": number} for task_id, number in numbers.items()]


class Acceptance(Document):
    """What a client is told when a batch is taken: the HTTP API's answer, and the core of
    the receipt beside a drop."""

    OMITTED: ClassVar[tuple[str, ...]] = ("failure", "duplicate", "metadata")

    ok: Literal[True]
    batch_id: str
    status: Literal["in_progress"] | BatchStatus = Field(
        description="in_progress while the batch runs; a duplicate of a batch that ended "
        "says how it ended"
    )
    task_count: int
    held: int = Field(description="credits held for the batch (0 once it ended)")
    issues: list[IssueNumber]
    failure: str | None = Field(None, description="why a failed batch failed")
    duplicate: bool = Field(
        False, description="true: the same bytes or batch_ref made this batch earlier"
    )
    metadata: dict[str, str] | None = Field(None, description="the batch's own metadata")


class RetryAcceptance(Acceptance):
    """What a retry answers: the new batch's acceptance, naming the batch it retries."""

    retry_of: str = Field(description="the failed or expired batch this one retries")


class Filing(Document):
    """Where a drop was filed: the name it was dropped as, and the name it is filed under
    when that one was taken or too long (`name.1.json`, `name~1a2b3c4d.json`)."""

    file: str
    filed_as: str | None = None


class BatchReceipt(Acceptance, Filing):
    """`accepted/<name>.receipt.json` beside an accepted batch file."""

    OMITTED: ClassVar[tuple[str, ...]] = ("failure", "duplicate", "filed_as", "metadata")

    client_id: str
    sha256: Sha256
    accepted_at: Timestamp


class CancelReceipt(Filing):
    """`accepted/cancel-<batch_id>.json.receipt.json` beside an accepted cancel request."""

    OMITTED: ClassVar[tuple[str, ...]] = ("filed_as",)

    ok: Literal[True]
    batch_id: str
    cancel: Literal[True]
    status: Literal["cancelling"] | BatchStatus
    client_id: str
    sha256: Sha256
    accepted_at: Timestamp


Receipt = BatchReceipt | CancelReceipt


class FieldError(Document):
    """One problem of an invalid batch: where, and why."""

    field: str
    reason: str


class ErrorFile(Filing):
    """`rejected/<name>.error.json` beside a rejected drop: a stable `reason` to act on,
    words in `message`, and the details that apply to that reason."""

    OMITTED: ClassVar[tuple[str, ...]] = (
        "filed_as",
        *("field", "errors", "limit", "line", "column", "byte"),
        *("client_id", "cost", "balance", "available", "batch_id", "status", "retried_by"),
    )

    ok: Literal[False]
    reason: RejectionReason
    message: str
    sha256: Sha256 | None = Field(description="null when the drop was refused unread")
    rejected_at: Timestamp
    field: str | None = Field(None, description="the field at fault, as a dotted path")
    errors: list[FieldError] | None = Field(None, description="invalid_batch: up to 20")
    limit: int | None = Field(None, description="too_large, too_many_tasks: the limit")
    line: int | None = Field(None, description="invalid_json: where")
    column: int | None = None
    byte: int | None = Field(None, description="invalid_encoding: the first bad byte")
    client_id: str | None = None
    cost: int | None = Field(None, description="unfunded: what the batch costs")
    balance: int | None = None
    available: int | None = None
    batch_id: str | None = Field(None, description="unknown_batch, not_running, use_retry")
    status: BatchStatus | None = Field(None, description="not_running, use_retry: how it ended")
    retried_by: str | None = Field(None, description="use_retry: the batch's retry, if any")


def receipt_for(fields: dict[str, Any]) -> BatchReceipt | CancelReceipt:
    """The receipt filed beside an accepted drop, from the intake's or the cancel's answer
    and where the drop came from (a field no receipt declares is an error)."""
    if fields.get("cancel"):
        return CancelReceipt.model_validate(fields)
    return BatchReceipt.with_issues(**fields)
