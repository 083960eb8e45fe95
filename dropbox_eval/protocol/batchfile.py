"""parse_batch: bytes -> BatchFile, the one parser of a batch: the inbox, the HTTP API
and `dropbox-eval validate`.

Refuses what JSON readers disagree on or what cannot be text: UTF-16/32, invalid UTF-8,
duplicate keys, unpaired surrogate escapes, NaN/Infinity, integers too long to convert;
checks the size and the task count before the model is built. `check_claims` and
`window_of` are the intake's checks of a parsed batch that need no state.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..errors import BatchRejected
from ..models import BatchFile, window_seconds
from ..util.names import refuse_reserved

_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F]")
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_32_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}


def parse_batch(raw: bytes, *, max_bytes: int, max_tasks: int) -> BatchFile:
    """The batch in `raw`, or BatchRejected saying why in words a client can act on."""
    check_size(len(raw), max_bytes)
    if not raw.strip():
        raise BatchRejected("invalid_json", "the file is empty")
    text = _decode(raw)
    document = _load_json(text)
    escapes_surrogates = _SURROGATE_ESCAPE_RE.search(text) is not None
    del text  # a copy of the file: not held while the tasks become models
    if not isinstance(document, dict):
        raise BatchRejected(
            "invalid_batch", "the document must be a JSON object", field="(document)"
        )
    if escapes_surrogates:
        _refuse_lone_surrogates(document)
    tasks = document.get("tasks")
    if isinstance(tasks, list):  # before pydantic parses 10,000+ tasks for nothing
        check_task_count(len(tasks), max_tasks)
    try:
        return BatchFile.model_validate(document)
    except ValidationError as exc:
        raise rejection_from_validation(exc) from exc


def check_size(size: int, limit: int) -> None:
    """Reject a document over the byte limit (before it is read in full, where possible)."""
    if size > limit:
        raise BatchRejected(
            "too_large", f"the batch is {size} bytes; the limit is {limit}", limit=limit
        )


def check_task_count(count: int, limit: int) -> None:
    """Reject a batch with more tasks than the per-batch limit."""
    if count > limit:
        raise BatchRejected(
            "too_many_tasks", f"{count} tasks; the limit is {limit}", field="tasks", limit=limit
        )


def check_claims(batch: BatchFile, client_id: str, max_tasks: int) -> None:
    """A parsed batch taken for `client_id` (its folder's, its API key's, or its own):
    neither id is reserved, the file claims no other client, the task count fits."""
    refuse_reserved(batch.client_id)  # names.py: the one rule, before the mismatch check
    refuse_reserved(client_id)
    if batch.client_id is not None and batch.client_id != client_id:
        raise BatchRejected(
            "client_mismatch",
            f"file claims client_id {batch.client_id!r} but was dropped for {client_id!r}",
            field="client_id",
        )
    check_task_count(len(batch.tasks), max_tasks)


def window_of(batch: BatchFile, default: int, longest: int) -> int:
    """The batch's completion window in seconds: its own (60 s to `longest`) or `default`."""
    if batch.completion_window is None:
        return default
    seconds = window_seconds(batch.completion_window)
    if not 60 <= seconds <= longest:
        raise BatchRejected(
            "invalid_batch",
            f"completion_window: must be between 60 and {longest} seconds",
            field="completion_window",
        )
    return seconds


def rejection_from_validation(exc: ValidationError) -> BatchRejected:
    """Turn pydantic's first error into a client-readable rejection with a field path."""
    first = exc.errors()[0]
    path = ".".join(str(part) for part in first["loc"]) or "(document)"
    return BatchRejected(
        "invalid_batch",
        f"{path}: {reason_of(first)}",
        field=path,
        errors=[
            {"field": ".".join(str(p) for p in e["loc"]), "reason": reason_of(e)}
            for e in exc.errors()[:20]
        ],
    )


_LENGTH_WORDS = {"too_short": "at least", "too_long": "at most"}


def reason_of(error: ErrorDetails) -> str:
    """A pydantic error in a client's words. A length limit checked after another validator
    is worded for lists ("at least 1 item after validation"): for a string it counts
    characters."""
    text = error.get("input")
    ctx = error.get("ctx") or {}
    if error["type"] in _LENGTH_WORDS and isinstance(text, str):
        limit = ctx.get("min_length", ctx.get("max_length"))
        unit = "character" if limit == 1 else "characters"
        return f"should have {_LENGTH_WORDS[error['type']]} {limit} {unit}, not {len(text)}"
    if error["type"] in _LENGTH_WORDS and isinstance(text, dict):  # metadata: keys, not items
        limit = ctx.get("min_length", ctx.get("max_length"))
        return f"should have {_LENGTH_WORDS[error['type']]} {limit} keys, not {len(text)}"
    return str(error["msg"])


def _decode(raw: bytes) -> str:
    for bom, encoding in _UTF16_32_BOMS.items():
        if raw.startswith(bom):
            raise BatchRejected(
                "invalid_encoding",
                f"the file is {encoding} (it starts with a "
                f"{encoding} byte-order mark); save it as UTF-8",
            )
    if b"\x00" in raw[:4]:  # JSON text cannot start with NUL; UTF-16/32 without a BOM does
        raise BatchRejected(
            "invalid_encoding",
            "the file looks like UTF-16 or UTF-32 (NUL "
            "bytes between the first characters); save it as UTF-8",
        )
    body = raw.removeprefix(_UTF8_BOM)  # RFC 8259 lets parsers ignore a UTF-8 BOM: we do
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        position = len(raw) - len(body) + exc.start
        raise BatchRejected(
            "invalid_encoding",
            f"the file is not UTF-8 (byte {position} is 0x{raw[position]:02x}); save it as UTF-8",
            byte=position,
        ) from exc


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError as exc:
        raise BatchRejected("invalid_json", "JSON is nested too deeply") from exc
    except json.JSONDecodeError as exc:
        ended_early = exc.pos >= len(text.rstrip())
        hint = " (the file ends early: an interrupted upload?)" if ended_early else ""
        raise BatchRejected(
            "invalid_json",
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}){hint}",
            line=exc.lineno,
            column=exc.colno,
        ) from exc
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise BatchRejected(
            "invalid_json", "not valid JSON here: a number has more than 4,300 digits"
        ) from exc


def _no_constant(name: str) -> Any:
    raise BatchRejected("invalid_json", f"{name} is not a JSON number (RFC 8259)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise BatchRejected(
                    "invalid_json",
                    f"duplicate key {key!r} in one object "
                    "(JSON readers disagree on which value wins)",
                    field=key,
                )
            seen.add(key)
    return document


def _refuse_lone_surrogates(document: Any) -> None:
    """`"\\ud800"` is valid JSON syntax but not text; refuse it before it reaches the forge."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BatchRejected(
                    "invalid_encoding",
                    "a string contains an unpaired UTF-16 "
                    "surrogate escape (\\ud800-\\udfff); every string must be "
                    "valid Unicode",
                ) from exc
