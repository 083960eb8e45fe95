"""Latency on a slow forge (40 ms per request): results by push, and drop -> receipt
(the second part of `bench/latency.py`, alone; see `_push.py`).

    python bench/push.py [--closes 20] [--drops 10] [--delay 0.04] [--json]
"""

from __future__ import annotations

import time

from _common import BenchResult, command_line, emit, parser
from _push import push_figures


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--closes", type=int, default=20)
    args_parser.add_argument("--drops", type=int, default=10)
    args_parser.add_argument("--delay", type=float, default=0.04)
    args = args_parser.parse_args()
    started = time.perf_counter()
    result = BenchResult("push", command_line())
    push_figures(result, args.closes, args.drops, args.delay)
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
