"""The service's workers, each on its own thread, so one slow peer delays nobody else.
They decide the flow between the stages, which never call each other:

- InboxWorker (inbox.py): watches the inbox and takes each ready file: read, check,
  record, receipt. Nothing there waits for the forge.
- OpenWorker (opening.py): opens the issues of each recorded batch, a bounded share of
  threads per client; every forge call waits its client's turn at the scheduler.
- ForgeWorker (polling.py): every poll interval, and at once for a repo a webhook or a
  settle alarm names, ends batches that are due (cancel, deadline) and polls each repo
  once, repos in parallel.
- DeliveryWorker (delivery.py): delivers reports as soon as a batch ends (woken by the
  settle stage), and retries on the schedule stored on each batch.

The Supervisor (supervisor.py) owns the inbox, forge and delivery workers' threads: a
loop that raises is restarted with backoff, and its state is what `status`, `/readyz`,
`/metrics` and `check` show.

Nothing retries inside a worker: each try of a forge call or a delivery is one visit, and
the schedule stored on the batch decides the next (attempts.py).
"""

from __future__ import annotations

from .delivery import DeliveryWorker
from .guard import FAST_TICK_SECONDS, TICK_SECONDS, guarded
from .inbox import InboxWorker
from .opening import OpenWorker
from .polling import ForgeWorker

__all__ = [
    "FAST_TICK_SECONDS",
    "TICK_SECONDS",
    "DeliveryWorker",
    "ForgeWorker",
    "InboxWorker",
    "OpenWorker",
    "guarded",
]
