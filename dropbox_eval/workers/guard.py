"""What every worker shares: one step's failure is logged and reported, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import DeliveryError, DropboxEvalError, storage_error

log = logging.getLogger("dropbox_eval")
TICK_SECONDS = 1.0
FAST_TICK_SECONDS = 0.05
POOL_SIZE = 4
Report = Callable[[str, Exception], None]


def guarded(what: str, report: Report, step: Callable[..., Any], *args: Any) -> Any:
    """Run one step; a failure is logged and reported, never fatal to the worker."""
    try:
        return step(*args)
    except DeliveryError:
        pass  # logged and scheduled by the delivery stage
    except DropboxEvalError as exc:
        log.warning("%s: %s", what, exc)
        report(what, exc)
    except Exception as exc:  # noqa: BLE001 - a worker must survive any single step
        # a full or read-only folder met where no writer translated it is a storage state
        storage = storage_error(exc) if isinstance(exc, OSError) else None
        if storage is None:
            log.exception("%s: unexpected error", what)
            report(what, exc)
        else:
            log.warning("%s: %s", what, storage)
            report(what, storage)
    return None
