"""A 100,000-task drop -> its receipt, against parsing and storing the same batch alone.

Product: a real `Service` (default settings but SAAS_EVAL_MAX_TASKS=100000) against a
sandbox forge in its own process; the batch file is written to `.part`, fsynced and
renamed into the inbox, and the clock runs until `accepted/<name>.receipt.json` exists
(the receipt is written atomically, once the batch and its hold are durable; its issues
are opened afterwards, and the forge fails every request once the receipt is there, so
the opener stops at once).

Baseline, in the same run: `parse_batch` of the same bytes + `Intake.record` into a fresh
state folder (validation, duplicate check, funds, the tasks file, the batch record, the
index row with the hold): what any receipt must wait for. Runs alternate (product,
baseline, baseline, product, ...) and the figure is the median of the per-pair ratios,
target <= 3.

    python bench/bigdrop.py [--tasks 100000] [--pairs 2] [--quick] [--json]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

from _common import (
    BenchResult,
    Stopwatch,
    add_median_ratio,
    command_line,
    emit,
    interleaved,
    parser,
)
from _forge import ForgeProcess
from _service import FUNDS, drop, product_settings, running, wait_until

from dropbox_eval.app import build_app
from dropbox_eval.protocol.batchfile import parse_batch

TARGET = 3.0


def compact_tasks(count: int) -> list[dict[str, str]]:
    """Small tasks (id, title, body), so 100,000 stay under the default 20 MB file limit."""
    return [
        {"task_id": f"t{i}", "title": f"Case {i}", "body": f"Run scenario {i}."}
        for i in range(count)
    ]


def product(forge: ForgeProcess, document: dict[str, object], tasks: int) -> float:
    """Seconds from the rename into the inbox until the receipt exists."""
    with running(forge, ["acme"], max_tasks=tasks) as run:
        receipt = run.inbox("acme") / "accepted" / "big.json.receipt.json"
        start = drop(run.inbox("acme"), "big.json", document)
        wait_until(receipt.exists, 600, 0.002)
        seconds = time.perf_counter() - start
        if json.loads(receipt.read_text(encoding="utf-8"))["task_count"] != tasks:
            raise RuntimeError("the receipt names the wrong task count")
    return seconds


def parse_and_store(forge: ForgeProcess, raw: bytes, tasks: int) -> float:
    """Seconds of `parse_batch` + `Intake.record` of `raw` into a fresh state folder."""
    with tempfile.TemporaryDirectory(prefix="bench-bigdrop-") as home:
        settings = product_settings(home, forge, max_tasks=tasks)
        app = build_app(settings, with_forge=False)
        app.billing.add_client("acme", FUNDS)
        with Stopwatch() as watch:
            batch = parse_batch(
                raw, max_bytes=settings.max_file_bytes, max_tasks=settings.max_tasks
            )
            recorded = app.intake.record(batch, "acme", source="acme/big.json")
    if recorded.batch.total != tasks:
        raise RuntimeError("the baseline stored the wrong task count")
    return watch.seconds


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--tasks", type=int, default=100_000)
    args_parser.add_argument("--pairs", type=int, default=2)
    args_parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = args_parser.parse_args()
    if args.quick:
        args.tasks, args.pairs = 10_000, 1
    started = time.perf_counter()
    document: dict[str, object] = {"batch_ref": "big", "tasks": compact_tasks(args.tasks)}
    raw = json.dumps(document).encode()
    with ForgeProcess() as forge:
        pairs = interleaved(
            args.pairs,
            lambda: product(forge, document, args.tasks),
            lambda: parse_and_store(forge, raw, args.tasks),
        )
    ratios = [drop_time / base for drop_time, base in pairs]
    result = BenchResult("bigdrop", command_line())
    result.add(
        "parse_batch + Intake.record alone (baseline)",
        statistics.median(base for _, base in pairs),
        "s",
        note=", ".join(f"{base:.2f} s" for _, base in pairs),
    )
    result.add(
        f"{args.tasks}-task drop -> receipt",
        statistics.median(drop_time for drop_time, _ in pairs),
        "s",
        note=", ".join(f"{drop_time:.2f} s" for drop_time, _ in pairs),
    )
    add_median_ratio(result, "drop -> receipt / parse + store", ratios, TARGET)
    result.info["setup"] = (
        f"one {len(raw) / 1e6:.1f} MB batch file of {args.tasks} tasks (id, title, body); "
        "Service.run in a thread, default settings but SAAS_EVAL_MAX_TASKS; sandbox forge "
        "in its own process; state on local disk; one repo per batch"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
