"""The store: its contract (contract.py), what every other part uses, and its TinyDB engine
(engine.py), built by the composition root; the only package that imports tinydb.

Layout under the state folder::

    index.json                    clients, the live ledger, one summary row per live batch,
                                  counts of archived batches (per client, per status) and
                                  running totals of the archive (totals.py)
    batches/<batch_id>.json       a live batch's record (one small row)
    tasks/<batch_id>.json         a live batch's tasks, written once at intake ...
    tasks/<batch_id>.journal      ... plus one JSON line per change (tasks.py)
    reports/<batch_id>.json       an ended live batch's report, fixed at its close (reports.py)
    keys/<client_id>/<key>        duplicate-drop keys (sha256 of the bytes, batch_ref) -> id
    archive/batches.jsonl         summary rows of emitted batches (append-only)
    archive/clients/<client_id>/  that client's archived batch rows and ledger entries
    archive/<YYYYMM>/history.*    emitted batches: one entry each (its record and tasks) in
                                  an append-only segment, and where each is (history.py);
                                  states archived before it keep `batches/` and `tasks/`
                                  files here, read where they are
    leases/<batch_id>.lock        per-batch lease of a live batch
    audit.jsonl                   the operators' actions, one JSON line each (audit.py)
    store.lock                    inter-process lock held around every read-modify-write
                                  (a transaction holds it over its block and its writes)

No operation's cost grows with the history: writes cost the change, the index and the live
folders hold only live batches, duplicate lookups are one file name, and listings read the
newest page from the end of an append-only file.
"""

from __future__ import annotations

from .contract import Store, TaskChanges, Transaction
from .rows import SUMMARY_FIELDS, BatchRow, HistoryPage

__all__ = ["SUMMARY_FIELDS", "BatchRow", "HistoryPage", "Store", "TaskChanges", "Transaction"]
