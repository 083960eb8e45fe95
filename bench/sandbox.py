"""What creating an issue costs the sandbox forge in a small repo and in a large one.

Every throughput figure taken on the sandbox includes its own work, so that work must not
grow with the repo: a change used to build a webhook payload counting every open issue and
pull request of the repo (quadratic over an intake). Two repos of one forge, one filled to
`--small` issues and one to `--large` (filled in-process), then `--samples` issues created
in each over loopback HTTP with a label, alternating between the two so load hits both
alike; the same again in-process (no HTTP) for the forge's own work, with a user hook
registered so each creation builds and queues its payload. The figures are the medians per
creation and their ratio, large / small (target <= 1.2).

    python bench/sandbox.py [--small 10] [--large 10000] [--samples 300] [--json]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import requests
from _common import BenchResult, command_line, emit, parser

from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.sandbox.state import ForgeState

TARGET = 1.2


def _fill(state: ForgeState, user: str, repo: str, count: int, label: int) -> None:
    for i in range(count):
        state.create_issue(user, repo, user, f"prefill {i}", body="x", labels=[label])


def _alternating(
    samples: int, small: Callable[[], None], large: Callable[[], None]
) -> list[list[float]]:
    """Milliseconds per call of `small` and of `large`, taken in turn."""
    times: list[list[float]] = [[], []]
    for _ in range(samples):
        for slot, call in enumerate((small, large)):
            started = time.perf_counter()
            call()
            times[slot].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    """Measure and print."""
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--small", type=int, default=10)
    args_parser.add_argument("--large", type=int, default=10_000)
    args_parser.add_argument("--samples", type=int, default=300)
    args = args_parser.parse_args()
    result = BenchResult("sandbox", command_line())
    started = time.perf_counter()
    with SandboxForge(port=0) as forge:
        state, user = forge.state, forge.user
        labels = {}
        for name, size in (("small", args.small), ("large", args.large)):
            state.create_repo(user, name)
            labels[name] = int(state.create_label(user, name, "eval-task", "ff0000")["id"])
            _fill(state, user, name, size, labels[name])
        session = requests.Session()
        session.headers["Authorization"] = f"token {forge.token}"

        def over_http(name: str) -> Callable[[], None]:
            url = f"{forge.url}/api/v1/repos/{user}/{name}/issues"
            body = {"title": "task", "body": "Do it.", "labels": [labels[name]]}

            def create() -> None:
                answer = session.post(url, json=body, timeout=30)
                answer.raise_for_status()

            return create

        http = _alternating(args.samples, over_http("small"), over_http("large"))
        state.hooks.add(f"owner:{user}", "http://127.0.0.1:9/unused", "s", ["issues"])

        def in_process(name: str) -> Callable[[], None]:
            return lambda: _fill(state, user, name, 1, labels[name])

        direct = _alternating(args.samples, in_process("small"), in_process("large"))
    for what, (small, large) in (("over HTTP", http), ("in-process, hook queued", direct)):
        small_ms, large_ms = statistics.median(small), statistics.median(large)
        ratio = large_ms / small_ms
        result.add(
            f"create an issue {what}: {args.large:,} / {args.small} issues in the repo",
            round(ratio, 2),
            "ratio",
            f"<= {TARGET}",
            ratio <= TARGET,
            note=f"median {large_ms:.3f} vs {small_ms:.3f} ms over {args.samples} each",
        )
    result.seconds = time.perf_counter() - started
    emit(result, args_parser.parse_args().json)


if __name__ == "__main__":
    main()
