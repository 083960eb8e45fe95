"""The JSON Schemas (draft 2020-12) of the documents a client exchanges with the service,
generated from the models that parse or build them: the batch file it drops, the receipt
and the error file filed beside the drop, and the report.

They ship in the package as `<name>.json` beside this module (`dropbox-eval schema NAME`
prints one); `python -m dropbox_eval.schemas --write` writes them afresh, and a test fails
when a shipped file differs from what the models generate now.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from ..models import BatchFile
from ..protocol.documents import ErrorFile, Receipt
from ..protocol.report import Report

DIALECT = "https://json-schema.org/draft/2020-12/schema"
MODELS: dict[str, tuple[Any, str, str]] = {
    "batch": (
        BatchFile,
        "dropbox-eval batch file",
        "A batch dropped into the inbox (or POSTed to /api/eval/batches). The schema is "
        "the shape; `dropbox-eval validate` makes every check the inbox makes.",
    ),
    "receipt": (
        Receipt,
        "dropbox-eval receipt",
        "accepted/<name>.receipt.json beside an accepted batch file or cancel request.",
    ),
    "error": (
        ErrorFile,
        "dropbox-eval error file",
        "rejected/<name>.error.json beside a rejected drop.",
    ),
    "report": (
        Report,
        "dropbox-eval report",
        "outbox/<batch_id>.json, reports/<batch_id>.json over SFTP, the callback's body "
        "and GET /api/eval/batches/{id}/report.",
    ),
}
NAMES = tuple(MODELS)


def generate(name: str) -> dict[str, Any]:
    """The schema of document `name` (one of NAMES), generated from its model now."""
    model, title, description = MODELS[name]
    schema: dict[str, Any] = TypeAdapter(model).json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    return {
        "$schema": DIALECT,
        "$id": f"urn:dropbox-eval:schema:{name}",
        "title": title,
        "description": description,
        **schema,
    }


def rendered(name: str) -> str:
    """The shipped file's text for document `name`, as generated now."""
    return json.dumps(generate(name), indent=2, ensure_ascii=False) + "\n"


def shipped(name: str) -> str:
    """The schema of document `name` as the package ships it."""
    return resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")


def write_all(folder: Path) -> None:
    """Write every schema into `folder` (this package's folder when shipping)."""
    for name in NAMES:
        (folder / f"{name}.json").write_text(rendered(name), encoding="utf-8")
