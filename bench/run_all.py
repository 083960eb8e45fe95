"""Run every bench script (each in its own process, `--json`) and print one table.

    python bench/run_all.py [--quick] [--only intake,poll,...] [--markdown] [--json]
    python bench/run_all.py --from results.json [--markdown]

`--quick` runs small sizes (a smoke test, not the documented figures); `--from FILE`
renders a saved `--json` document as a table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import code_version, fmt, machine_note, parser

HERE = Path(__file__).resolve().parent
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    # name: (default arguments, --quick arguments)
    "intake": ([], ["--tasks", "1000", "--pairs", "2"]),
    "poll": ([], ["--tasks", "1000", "--batches", "4", "--batch-tasks", "50"]),
    "history": ([], ["--batches", "40", "--listing-large", "200"]),
    "latency": ([], ["--drops", "5", "--closes", "5", "--push-drops", "3"]),
    "isolation": ([], ["--drops", "8"]),
    "metrics": ([], ["--large", "200"]),
    "sftp": ([], ["--drops", "5", "--uploads", "100", "--rounds", "1", "--listing", "200"]),
    "bounds": ([], ["--seconds", "2", "--uploads", "100"]),
    "sandbox": ([], ["--large", "1000", "--samples", "50"]),
    "search": ([], ["--large", "300", "--samples", "50"]),
    "rss": (
        [],
        ["--batches", "2", "--tasks", "2000", "--cycle-batches", "2", "--cycle-tasks", "500"],
    ),
    # many clients, one forge (issue 18): a forge with a capacity, the product at defaults
    "flow": ([], ["--quick"]),
    "burst": ([], ["--quick"]),
    "fairness": ([], ["--quick"]),
    "inbox_fairness": ([], ["--quick"]),
    "report": ([], ["--quick"]),
    "bigdrop": ([], ["--quick"]),
    "limiter": ([], ["--quick"]),
    "cli_start": ([], ["--quick"]),
    # nodes on PostgreSQL (issue 33): drops/s beside TinyDB, a killed node's takeover
    "nodes": ([], ["--quick"]),
}


def run(name: str, extra: list[str]) -> dict[str, Any]:
    """One bench as a child process; its JSON document plus the wall time."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py"), *extra, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return {
            "bench": name,
            "error": (done.stderr or done.stdout)[-2000:],
            "command": f"python bench/{name}.py {' '.join(extra)}".strip(),
            "figures": [],
            "seconds": time.perf_counter() - started,
        }
    data: dict[str, Any] = json.loads(done.stdout)
    data["command"] = f"python bench/{name}.py {' '.join(extra)}".strip()
    return data


def table(results: list[dict[str, Any]], markdown: bool) -> str:
    """All figures as a plain or Markdown table."""
    rows = [("bench", "figure", "value", "target", "verdict", "command")]
    for data in results:
        if "error" in data:
            rows.append((data["bench"], "ERROR", "", "", "FAIL", data["command"]))
            continue
        for fig in data["figures"]:
            value = f"{fmt(fig['value'])} {fig['unit']}".strip()
            rows.append(
                (data["bench"], fig["name"], value, fig["target"], fig["verdict"], data["command"])
            )
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += [
            "| " + " | ".join(c if i < 5 else f"`{c}`" for i, c in enumerate(r)) + " |"
            for r in rows[1:]
        ]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)).rstrip() for r in rows
    )


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--quick", action="store_true")
    args_parser.add_argument("--only", default="", help="comma-separated bench names")
    args_parser.add_argument("--markdown", action="store_true")
    args_parser.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="render a saved `run_all.py --json` document instead",
    )
    args = args_parser.parse_args()
    chosen = [n for n in BENCHES if not args.only or n in args.only.split(",")]
    if args.source:
        saved = json.loads(Path(args.source).read_text(encoding="utf-8"))
        print(table(saved["results"], args.markdown))
        print(f"\nmachine: {saved['machine']}; code: {saved['code']}")
        return
    results: list[dict[str, Any]] = []
    for name in chosen:
        default, quick = BENCHES[name]
        if not args.json:
            print(f"running {name} ...", file=sys.stderr, flush=True)
        results.append(run(name, quick if args.quick else default))
    if args.json:
        print(
            json.dumps(
                {"machine": machine_note(), "code": code_version(), "results": results}, indent=2
            )
        )
        return
    print(table(results, args.markdown))
    print()
    for data in results:
        print(f"{data['bench']}: {data['seconds']:.0f} s  ({data['command']})")
        for key, value in data.get("info", {}).items():
            print(f"    {key}: {value}")
        if "error" in data:
            print(f"    ERROR: {data['error']}")
    print(f"machine: {machine_note()}")
    print(f"code: {code_version()}")
    if any("error" in d for d in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
