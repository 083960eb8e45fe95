"""Pydantic models: the batch file clients drop, the records we store, the report we emit."""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

from .accounts import LEGACY_KEY_PREFIX as LEGACY_KEY_PREFIX
from .accounts import ApiKey as ApiKey
from .accounts import Client as Client
from .accounts import LedgerEntry as LedgerEntry
from .accounts import LedgerKind as LedgerKind
from .util.names import is_reserved_client_id
from .util.printable import BIDI_CLASS, bidi_reason
from .util.timestamps import utcnow as utcnow

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_TEXT_PATTERN = f"^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f{BIDI_CLASS[1:-1]}]*$"
"""Text's rule as the JSON Schemas publish it: no control, no bidi control (_check_text)."""


class BatchStatus(StrEnum):
    """Where a batch is: `running` until every task finished, then one terminal status."""

    RUNNING = "running"
    COMPLETED = "completed"
    EMITTED = "emitted"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        """Every status but `running` is final."""
        return self is not BatchStatus.RUNNING


class TaskStatus(StrEnum):
    """`pending` (no issue yet) -> `open` -> a finished status. `closed` is what records
    stored before `no_verdict` existed say for a lane close without a verdict."""

    PENDING = "pending"
    OPEN = "open"
    PASSED = "passed"
    FAILED = "failed"
    NO_VERDICT = "no_verdict"
    CLOSED = "closed"
    MISSING = "missing"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    ABORTED = "aborted"

    @property
    def is_finished(self) -> bool:
        """Anything but `pending` and `open`."""
        return self not in (TaskStatus.PENDING, TaskStatus.OPEN)

    @property
    def is_lane_verdict(self) -> bool:
        """Finished by the lane (these are charged); the rest ended without its work. A
        `no_verdict` close is the lane's work too: it picked the task up and closed it."""
        return self in (
            TaskStatus.PASSED,
            TaskStatus.FAILED,
            TaskStatus.NO_VERDICT,
            TaskStatus.CLOSED,
        )


def _check_id(value: str) -> str:
    if ".." in value:
        raise ValueError("must not contain '..'")
    return value


def _check_text(value: str) -> str:
    if _CONTROL_RE.search(value):
        raise ValueError("must not contain NUL or control characters")
    bidi = bidi_reason(value)  # printable.py: the one rule, file names' too
    if bidi is not None:
        raise ValueError(bidi)
    return value


Id = Annotated[
    str,
    Field(pattern=ID_PATTERN, json_schema_extra={"not": {"pattern": r"\.\."}}),
    AfterValidator(_check_id),
]


def is_valid_id(value: str) -> bool:
    """Client, task, batch and batch_ref ids: safe in file and repo names."""
    return re.match(ID_PATTERN, value) is not None and ".." not in value


def is_valid_client_id(value: str) -> bool:
    """A valid id that is not reserved (names.reserved_reason): safe as a client folder."""
    return is_valid_id(value) and not is_reserved_client_id(value)


Text = Annotated[
    str,
    AfterValidator(_check_text),
    Field(json_schema_extra={"pattern": _TEXT_PATTERN}),
]


METADATA_KEYS = 16  # as OpenAI's batches: 16 keys of 64 characters, values of 512
MetadataKey = Annotated[
    str,
    AfterValidator(_check_text),
    Field(
        min_length=1,
        max_length=64,
        json_schema_extra={"not": {"pattern": "[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]"}},
    ),
]
MetadataValue = Annotated[Text, Field(max_length=512)]
Metadata = Annotated[
    dict[MetadataKey, MetadataValue],
    Field(
        max_length=METADATA_KEYS,
        description="your own labels (a run id, a commit): at most 16 keys of at most 64 "
        "characters, string values of at most 512; kept in the receipt, every view of the "
        "batch and its report",
    ),
]


_WINDOW_RE = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(value: str | int) -> int:
    """`"24h"`, `"90m"`, `"2d"`, `"600s"` or a number of seconds -> seconds."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _WINDOW_RE.match(str(value))
    if not match or int(match.group(1)) <= 0:
        raise ValueError("must be a positive number of seconds or like '24h', '90m', '2d'")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def new_batch_id(now: datetime | None = None) -> str:
    """A sortable id, unique even after the state is wiped: UTC time + random suffix."""
    moment = now or utcnow()
    return f"{moment:%Y%m%d-%H%M%S}-{moment.microsecond // 1000:03d}{secrets.token_hex(3)}"


class TaskSpec(BaseModel):
    """One task as the client wrote it."""

    model_config = ConfigDict(extra="forbid")

    task_id: Id = Field(description="unique in the batch")
    title: Annotated[Text, Field(min_length=1, max_length=255)]
    body: Text = Field("", description="the issue's text (Markdown)")
    acceptance: list[Text] = Field(
        default_factory=list, description="shown as checkboxes under the body"
    )


class BatchFile(BaseModel):
    """The JSON document a client drops into the inbox."""

    model_config = ConfigDict(extra="forbid")

    client_id: Id | None = Field(
        None,
        description="required at the top of the inbox; in inbox/<client_id>/ it may be left "
        "out, or must name that folder's client",
    )
    batch_ref: Id | None = Field(
        None, description="your name for the batch: the same batch_ref again is a duplicate"
    )
    callback_url: str | None = Field(
        None,
        description="http(s) URL the report is POSTed to (signed); its host must resolve to "
        "a public address, as the service sees it",
    )
    completion_window: str | int | None = Field(
        None,
        description="seconds, or like '24h', '90m', '2d': tasks still open then are closed "
        "(60 s to SAAS_EVAL_MAX_COMPLETION_WINDOW; default SAAS_EVAL_COMPLETION_WINDOW)",
    )
    tasks: list[TaskSpec] = Field(
        min_length=1,
        description="at most SAAS_EVAL_MAX_TASKS (10,000 by default), task_ids unique",
    )
    metadata: Metadata | None = None

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            window_seconds(value)
        return value

    @field_validator("tasks")
    @classmethod
    def _unique_task_ids(cls, tasks: list[TaskSpec]) -> list[TaskSpec]:
        seen: set[str] = set()
        for task in tasks:
            if task.task_id in seen:
                raise ValueError(f"duplicate task_id {task.task_id!r}")
            seen.add(task.task_id)
        return tasks

    @field_validator("callback_url")
    @classmethod
    def _http_only(cls, url: str | None) -> str | None:
        """Empty means none; the scheme and the rest are judged by CallbackPolicy, which
        answers `callback_refused` with the reason."""
        return url or None


class PullRequestRef(BaseModel):
    """The pull request of a task: the one whose merge closed the issue (`closed_issue`),
    else the last one that references it with a closing keyword, merged or not. `repo` is
    the repo it lives in (another repo for `Closes owner/name#N`). `merge_commit_sha` and
    the size fields come from one more GET of the pull request (setting `pull_details`);
    null without it."""

    number: int
    url: str
    merged: bool
    closed_issue: bool = False
    repo: str | None = None
    merged_at: datetime | None = None
    merge_commit_sha: str | None = None
    additions: int | None = None
    deletions: int | None = None
    changed_files: int | None = None


class TaskResult(BaseModel):
    """What the lane said about one task: every field is a field of the task's line in
    the report too (ReportResult extends it), so a new one is read in results/lane.py and
    reported with no other change."""

    summary: str = ""
    details: Any = None
    pull_request: PullRequestRef | None = None
    summary_edited_after_settle: bool = Field(
        default=False,
        description="The lane's comment was edited after the settle moment: the summary and "
        "details are its body as read, not as it stood then (present only when true).",
    )


class Settling(BaseModel):
    """A closed issue waiting until nothing changed about it for `settle_seconds` (the task
    stays `open` meanwhile); its result is read once that time passed (`status` and
    `result` stay None until then, or hold a reading that an edit sent back to settle)."""

    status: TaskStatus | None = None
    result: TaskResult | None = None
    closed_at: datetime | None = None
    changed_at: datetime  # the forge's time of the last change seen
    seen: str  # what the issue listing showed (see reading.listing_key)


class TaskRecord(BaseModel):
    """One task as stored (table `eval_tasks` of the seed)."""

    task_id: str
    batch_id: str
    repo: str
    issue_number: int | None = None
    issue_url: str | None = None
    payload: TaskSpec
    status: TaskStatus = TaskStatus.PENDING
    result: TaskResult | None = None
    created_at: datetime
    finished_at: datetime | None = None
    settling: Settling | None = None  # closed by the lane, not settled yet


BATCH_WIDE_TASK_FIELDS = ("batch_id", "repo", "created_at")
"""A task record's fields that hold the same value in every task of its batch (shared
where tasks are kept by the thousand: util/compact.py)."""


class BatchRecord(BaseModel):
    """One batch as stored (table `eval_batches` of the seed)."""

    batch_id: str
    client_id: str
    batch_ref: str | None = None
    callback_url: str | None = None
    status: BatchStatus = BatchStatus.RUNNING
    repo: str
    source: str | None = None
    sha256: str | None = None
    total: int
    done: int = 0
    cost: int = 0
    unit_price: int = 0
    charged: int | None = None
    created_at: datetime
    deadline: datetime | None = None
    completed_at: datetime | None = None
    emitted_at: datetime | None = None
    last_polled_at: datetime | None = None
    intake_done: bool = False
    open_started: bool = False  # an attempt to create its issues began (adopt, then create)
    open_clean: bool = False  # every issue created so far is recorded: nothing to adopt
    filed: bool = False  # the dropped file sits beside its receipt
    settling_tasks: int = 0  # closed issues whose result is not final yet
    cancel_requested: bool = False
    delivery_attempts: int = 0
    next_delivery_at: datetime | None = None
    last_delivery_error: str | None = None
    attempts: int = 0  # forge visits that failed in a row (intake, polling, closing)
    last_error: str | None = None
    next_attempt_at: datetime | None = None
    failure: str | None = None  # why a `failed` batch failed, in the client's words
    retry_of: str | None = None  # the failed or expired batch this one retries
    retried_by: str | None = None  # the batch retrying this one (written before it exists)
    metadata: dict[str, str] | None = None  # the client's labels (BatchFile.metadata)
