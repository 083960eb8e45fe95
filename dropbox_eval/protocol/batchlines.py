"""JSON Lines batches and reports: one task per line, as OpenAI's and Anthropic's batch APIs
take their requests, so a client writes (and reads) a 100,000-task batch as a stream.

A batch file `*.jsonl` (or `*.ndjson`) holds one JSON object per line: every line a task
(the batch file's `tasks` items), except an optional first line `{"batch": {...}}` holding
the batch's own fields (`client_id`, `batch_ref`, `callback_url`, `completion_window`, ...:
every field of the JSON batch file but `tasks`). Blank lines are skipped; a line may end in
CRLF. Each line is read with the JSON batch file's rules (batchfile.py: UTF-8, no duplicate
keys, no NaN, no lone surrogates), and an error names its line.

A report as JSON Lines (`report_lines`) is its first line `{"batch": {...}}` (the report
without `results`), then one line per task: the `results` items, in the batch's order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from pydantic import ValidationError

from ..errors import BatchRejected
from ..models import BatchFile
from .batchfile import (
    _SURROGATE_ESCAPE_RE,
    _decode,
    _load_json,
    _refuse_lone_surrogates,
    check_size,
    check_task_count,
    reason_of,
)

LINES_SUFFIXES = (".jsonl", ".ndjson")
LINES_MEDIA_TYPES = ("application/jsonl", "application/x-ndjson", "application/x-jsonlines")
HEADER = "batch"  # the key of the optional first line
_JSON_WHERE_RE = re.compile(r" \(line \d+, column \d+\)")  # a line's own, not the file's


def is_lines_name(name: str) -> bool:
    """Whether a file name says JSON Lines (`*.jsonl`, `*.ndjson`, any case)."""
    return name.lower().endswith(LINES_SUFFIXES)


def is_lines_media_type(content_type: str) -> bool:
    """Whether a Content-Type (or one Accept entry) names JSON Lines."""
    return content_type.split(";", 1)[0].strip().lower() in LINES_MEDIA_TYPES


def parse_batch_lines(raw: bytes, *, max_bytes: int, max_tasks: int) -> BatchFile:
    """The batch in a JSON Lines file, or BatchRejected naming the line at fault."""
    check_size(len(raw), max_bytes)
    text = _decode(raw)
    header: dict[str, Any] = {}
    header_line = 0
    tasks: list[Any] = []
    line_of: list[int] = []  # task index -> its line number
    first_seen: dict[Any, int] = {}  # task_id -> its line
    for number, line in enumerate(text.split("\n"), 1):  # U+2028 is no line end
        if not line.strip():
            continue
        document = _line(line, number)
        if _is_header(document):
            if tasks or header_line:
                raise _misplaced(number)
            header, header_line = _header(document[HEADER], number), number
            continue
        _refuse_duplicate(document.get("task_id"), number, first_seen)
        tasks.append(document)
        line_of.append(number)
        if len(tasks) > max_tasks:
            check_task_count(len(tasks), max_tasks)
    if not tasks:
        raise BatchRejected(
            "invalid_batch", "the file holds no task line (one JSON object per task)", field="tasks"
        )
    try:
        return BatchFile.model_validate({**header, "tasks": tasks})
    except ValidationError as exc:
        raise _rejection(exc, line_of, header_line) from exc


def _line(line: str, number: int) -> dict[str, Any]:
    """One line as a JSON object, read with the JSON batch file's rules."""
    try:
        document = _load_json(line)
    except BatchRejected as exc:
        column = exc.details.get("column")
        where = f"line {number}" + (f", column {column}" if column else "")
        message = _JSON_WHERE_RE.sub("", exc.message)
        details = {"line": number, "column": column} if column else {"line": number}
        raise BatchRejected(exc.reason, f"{where}: {message}", **details) from exc
    if not isinstance(document, dict):
        raise BatchRejected(
            "invalid_batch", f"line {number}: each line must be one JSON object", line=number
        )
    if _SURROGATE_ESCAPE_RE.search(line):
        try:
            _refuse_lone_surrogates(document)
        except BatchRejected as exc:
            raise BatchRejected(exc.reason, f"line {number}: {exc.message}", line=number) from exc
    return document


def _is_header(document: dict[str, Any]) -> bool:
    return list(document) == [HEADER]


def _misplaced(number: int) -> BatchRejected:
    return BatchRejected(
        "invalid_batch",
        f'line {number}: only the first line may be {{"batch": {{...}}}}',
        field=HEADER,
        line=number,
    )


def _refuse_duplicate(task_id: Any, number: int, first_seen: dict[Any, int]) -> None:
    """A task_id seen on an earlier line (checked here, where the lines are known)."""
    if not isinstance(task_id, str):
        return  # the model says what is wrong with it
    earlier = first_seen.setdefault(task_id, number)
    if earlier != number:
        raise BatchRejected(
            "invalid_batch",
            f"line {number}: duplicate task_id {task_id!r} (first on line {earlier})",
            field="task_id",
            line=number,
        )


def _header(fields: Any, number: int) -> dict[str, Any]:
    """The batch's own fields from the first line; `tasks` belongs on the lines below."""
    if not isinstance(fields, dict):
        raise BatchRejected(
            "invalid_batch",
            f'line {number}: "batch" must be an object of the batch\'s fields',
            field=HEADER,
            line=number,
        )
    if "tasks" in fields:
        raise BatchRejected(
            "invalid_batch",
            f"line {number}: batch.tasks: tasks go one per line below the first line",
            field="batch.tasks",
            line=number,
        )
    return fields


def _rejection(exc: ValidationError, line_of: list[int], header_line: int) -> BatchRejected:
    """Pydantic's errors with the line at fault: `line 7: tasks.5.title: Field required`."""
    found = [(*_where(e["loc"], line_of, header_line), reason_of(e)) for e in exc.errors()[:20]]
    errors = [{"field": f, "reason": f"line {n}: {r}" if n else r} for f, n, r in found]
    field, line, reason = found[0]
    message = f"line {line}: {field}: {reason}" if line else f"{field}: {reason}"
    details: dict[str, Any] = {"field": field, "errors": errors}
    if line:
        details["line"] = line
    return BatchRejected("invalid_batch", message, **details)


def _where(
    loc: tuple[int | str, ...], line_of: list[int], header_line: int
) -> tuple[str, int | None]:
    """(field path, line number) of an error: a task's field (`tasks.5.title`, on the
    task's line), the list of tasks (a duplicate task_id), or a field of the first line."""
    path = ".".join(str(part) for part in loc) or "(document)"
    if len(loc) >= 2 and loc[0] == "tasks" and isinstance(loc[1], int):
        return path, line_of[loc[1]]
    if loc and loc[0] == "tasks":
        return path, None
    return f"batch.{path}", header_line or None


def report_lines(report: dict[str, Any]) -> Iterator[bytes]:
    """The report as JSON Lines: `{"batch": {...}}` first, then one line per task."""
    header = {key: value for key, value in report.items() if key != "results"}
    yield _dump({HEADER: header})
    for line in report["results"]:
        yield _dump(line)


def lines_bytes(lines: Iterable[bytes]) -> bytes:
    """A JSON Lines document in one piece (an outbox file, a callback body)."""
    return b"".join(lines)


def _dump(document: dict[str, Any]) -> bytes:
    """One compact line; what orjson refuses (an integer past 64 bits in a lane's details)
    goes through the standard library."""
    try:
        return orjson.dumps(document) + b"\n"
    except TypeError:
        return (json.dumps(document, separators=(",", ":")) + "\n").encode("ascii")
