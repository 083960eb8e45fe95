"""Logging for the command line: quiet one-shot commands, INFO for the service, JSON lines."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
NOISY = ("urllib3", "watchdog", "filelock", "asyncssh")


_KEY_RE = re.compile(r"([?&]key=)[^&\s]*")


class RedactKey(logging.Filter):
    """Keeps the operator key of `/operator?key=...` out of the access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the arguments of the record; never drops it."""
        if isinstance(record.args, tuple):
            record.args = tuple(
                _KEY_RE.sub(r"\1***", arg) if isinstance(arg, str) else arg for arg in record.args
            )
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(verbose: int, log_format: str, *, service: bool) -> None:
    """WARNING for one-shot commands and INFO for long-running ones; each -v one step more."""
    base = 1 if service else 0
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(base + verbose, 2)]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
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
