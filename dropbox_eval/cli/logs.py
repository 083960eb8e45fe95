"""Logging for the command line: quiet one-shot commands, INFO for the service, JSON lines.

Every message passes through `printable` in both formats: names from clients (files, SSH
users, paths) can hold a newline or a terminal escape, and a log line is one line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from ..util.logfilter import RepeatFilter
from ..util.printable import printable

TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
NOISY = ("urllib3", "watchdog", "filelock", "asyncssh")


_KEY_RE = re.compile(r"([?&]key=)[^&\s]*")


class RedactKey(logging.Filter):
    """Keeps an operator key out of the access log: the page no longer reads `?key=`, but
    an old bookmark still sends it."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the arguments of the record; never drops it."""
        if isinstance(record.args, tuple):
            record.args = tuple(
                _KEY_RE.sub(r"\1***", arg) if isinstance(arg, str) else arg for arg in record.args
            )
        return True


class TextFormatter(logging.Formatter):
    """`time LEVEL message`; a traceback's lines are escaped too and indented, so that no
    line of it can pass for a record of its own."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging API
        """The line with its message escaped."""
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging API
        """The traceback, each line escaped and indented."""
        return _escaped_lines(super().formatException(ei), indent="  ")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (its message escaped like a text line's)."""
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": printable(record.getMessage()),
        }
        if record.exc_info:
            line["exception"] = _escaped_lines(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


def _escaped_lines(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}{printable(line)}" for line in text.split("\n"))


def configure_logging(verbose: int, log_format: str, *, service: bool) -> None:
    """WARNING for one-shot commands and INFO for long-running ones; each -v one step more."""
    base = 1 if service else 0
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(base + verbose, 2)]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RepeatFilter())  # a full disk: one line a minute, not thousands
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactKey) for f in access.filters):
        access.addFilter(RedactKey())
