"""A burst's aftermath: forge requests and poll cycles until the service is idle again.

`--batches` one-task batches are taken in through the product (in-process sandbox forge,
one repo per batch; its lane closes each issue, whose result is then read once), after
two service poll cycles (the service has searched once: a running service). Then real
`Service.poll_cycle()` calls are made (no full reconciliation) until a cycle makes at most
one request (the cross-repo search): the figures are the cycles and requests that took,
requests per batch, and the requests of the idle cycle after. Then, for context, the
periodic full reconciliation's requests at that many live batches.

Target: the aftermath settles within one cycle per 100 batches (ceil(batches / 100)).

    python bench/aftermath.py [--batches 300] [--max-cycles 50] [--json]
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import Counter

from _common import BenchResult, command_line, emit, make_tasks, parser, settings_for

from dropbox_eval.app import build_app, service_for
from dropbox_eval.sandbox import SandboxForge


def _kind(method: str, path: str) -> str:
    """A request's route, the repo's name left out."""
    route = path.split("/api/v1")[-1].split("?")[0]
    parts = route.split("/")
    if route.startswith("/repos/") and len(parts) > 4:
        route = "/repos/{repo}/" + "/".join(parts[4:])
    return f"{method} {route}"


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--batches", type=int, default=300)
    args_parser.add_argument("--max-cycles", type=int, default=50)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("aftermath", command_line())
    with SandboxForge(port=0) as forge, tempfile.TemporaryDirectory(prefix="bench-aft-") as tmp:
        app = build_app(settings_for(tmp, forge.url, forge.token, forge.user))
        app.billing.add_client("bench", 10**9)
        service = service_for(app)
        service.forge.cycles = 1  # not the periodic full poll
        for warm in ("w1", "w2"):  # two repos: one alone is listed, not searched
            app.intake.submit_batch("bench", make_tasks(1, f"{warm}-"), batch_ref=warm)
        service.poll_cycle()  # lists the repo once (a start)
        service.forge.cycles = 1
        service.poll_cycle()  # the service has searched once, as a running one has
        for n in range(args.batches):
            app.intake.submit_batch("bench", make_tasks(1, f"b{n}-"), batch_ref=f"r{n}")
        cycles, requests, kinds = 0, 0, Counter[str]()
        while cycles < args.max_cycles:
            forge.clear_requests()
            service.forge.cycles = 1
            service.poll_cycle()
            cycles += 1
            log = forge.requests
            requests += len(log)
            kinds.update(_kind(r.method, r.path) for r in log)
            if len(log) <= 1:
                break
        forge.clear_requests()
        service.forge.cycles = 1
        service.poll_cycle()
        idle = len(forge.requests)
        forge.clear_requests()
        service.forge.cycles = 0  # the periodic full reconciliation
        service.poll_cycle()
        full = len(forge.requests)
    target = math.ceil(args.batches / 100)
    result.add(
        f"cycles until idle after {args.batches} new batches",
        cycles,
        "cycles",
        f"<= {target}",
        cycles <= target,
        note=f"the last one idle (at most 1 request); requests by path: {dict(kinds)}",
    )
    result.add(
        "requests until idle, per new batch",
        requests / args.batches,
        "req/batch",
        note=f"{requests} requests in all",
    )
    result.add("requests of the idle cycle after", idle, "requests")
    result.add(f"full reconciliation at {args.batches + 2} live batches", full, "requests")
    result.info["setup"] = (
        f"{args.batches} one-task batches, one repo each, in-process SandboxForge (its lane "
        "closes them); cycles made with Service.poll_cycle()"
    )
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
