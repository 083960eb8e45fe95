"""The command line's start-up cost: `dropbox-eval --help` against `python -c "import click"`.

Both run as child processes of this script, interleaved (help, click, click, help, ...),
and each child's CPU time (user + system, from `getrusage(RUSAGE_CHILDREN)`) is taken; CPU
time, not wall time, so the other jobs on the machine move the figure less. The figure is
the median of the per-pair ratios, target <= 3; `python -c pass` is shown for context
(the interpreter's own start).

    python bench/cli_start.py [--runs 15] [--quick] [--json]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import BenchResult, add_median_ratio, command_line, emit, interleaved, parser

TARGET = 3.0


def cli_command() -> list[str]:
    """The `dropbox-eval` console script beside this interpreter (else `-m dropbox_eval`)."""
    script = Path(sys.executable).parent / "dropbox-eval"
    if script.exists():
        return [str(script), "--help"]
    return [sys.executable, "-m", "dropbox_eval", "--help"]


def cpu_seconds(command: list[str]) -> float:
    """User + system CPU seconds of one run of `command` (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "COLUMNS": "100"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heaviest_imports(count: int = 6) -> str:
    """The modules `import dropbox_eval.cli` spends most on (cumulative, `-X importtime`),
    among those it imports directly (`-P`: the installed package, not the one in the
    current folder)."""
    done = subprocess.run(
        [sys.executable, "-P", "-X", "importtime", "-c", "import dropbox_eval.cli"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            if len(name) - len(name.lstrip()) == 3:  # one level below the module itself
                rows.append((int(parts[1]), name.strip()))
    rows.sort(reverse=True)
    return ", ".join(f"{name} {micros / 1000:.0f} ms" for micros, name in rows[:count])


def main() -> None:
    args_parser = parser(__doc__ or "")
    args_parser.add_argument("--runs", type=int, default=15, help="pairs")
    args_parser.add_argument("--quick", action="store_true", help="3 pairs")
    args = args_parser.parse_args()
    if args.quick:
        args.runs = 3
    started = time.perf_counter()
    help_run = cli_command()
    click_run = [sys.executable, "-c", "import click"]
    bare_run = [sys.executable, "-c", "pass"]
    cpu_seconds(help_run)  # warm the page cache and the bytecode
    pairs = interleaved(args.runs, lambda: cpu_seconds(help_run), lambda: cpu_seconds(click_run))
    bare = statistics.median(cpu_seconds(bare_run) for _ in range(args.runs))
    ratios = [cli / click for cli, click in pairs]
    result = BenchResult("cli_start", command_line())
    result.add(
        "`dropbox-eval --help` CPU",
        statistics.median(cli for cli, _ in pairs) * 1000,
        "ms",
        note=" ".join([Path(help_run[0]).name, *help_run[1:]]),
    )
    result.add(
        '`python -c "import click"` CPU (baseline)',
        statistics.median(click for _, click in pairs) * 1000,
        "ms",
        note=f'`python -c "pass"`: {bare * 1000:.0f} ms',
    )
    add_median_ratio(result, "--help / import click (CPU)", ratios, TARGET)
    result.info["import dropbox_eval.cli, heaviest direct imports"] = heaviest_imports()
    result.seconds = time.perf_counter() - started
    emit(result, args.json)


if __name__ == "__main__":
    main()
