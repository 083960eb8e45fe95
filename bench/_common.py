"""Shared helpers of the bench scripts: figures with targets, output, forge in a process.

Not part of the package and not imported by the tests. Every bench script is run as
`python bench/<name>.py [--json]`; this module sits beside them on `sys.path[0]`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from dropbox_eval.config import Settings, load_settings

logging.getLogger("dropbox_eval").setLevel(logging.WARNING)
START_LOAD = os.getloadavg()
First = TypeVar("First")
Second = TypeVar("Second")


@dataclass
class Figure:
    """One measured number, its target (if any) and whether the target is met."""

    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""

    @property
    def verdict(self) -> str:
        """PASS / MISS, or '-' for a figure without a target (a baseline or context)."""
        if self.ok is None:
            return "-"
        return "PASS" if self.ok else "MISS"


@dataclass
class BenchResult:
    """What one bench script prints (or emits as JSON)."""

    bench: str
    command: str
    figures: list[Figure] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def add(
        self,
        name: str,
        value: float,
        unit: str,
        target: str = "",
        ok: bool | None = None,
        note: str = "",
    ) -> Figure:
        """Append a figure and return it."""
        figure = Figure(name, value, unit, target, ok, note)
        self.figures.append(figure)
        return figure

    def to_json(self) -> dict[str, Any]:
        """Plain dict with every figure and the machine note."""
        data = asdict(self)
        for item, figure in zip(data["figures"], self.figures, strict=True):
            item["verdict"] = figure.verdict
        data["machine"] = machine_note()
        data["code"] = code_version()
        data["load_at_start"] = round(START_LOAD[0], 2)
        return data


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser that already knows `--json`."""
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--json", action="store_true", help="print one JSON document")
    return result


def command_line() -> str:
    """The command that ran this script, relative to the project root."""
    script = os.path.relpath(sys.argv[0], start=project_root())
    return " ".join(["python", script, *sys.argv[1:]])


def project_root() -> str:
    """The folder that holds `bench/`."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine_note() -> str:
    """CPU count, Python, platform and date (figures are ratios, but context helps)."""
    cpus = os.cpu_count() or 0
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    return (
        f"{cpus} cores, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}, {stamp}"
    )


def code_version() -> str:
    """Git HEAD plus a digest of the package sources (the tree is edited concurrently)."""
    root = project_root()
    digest = hashlib.sha256()
    package = os.path.join(root, "dropbox_eval")
    for folder, _dirs, files in sorted(os.walk(package)):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as handle:
                    digest.update(name.encode() + handle.read())
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "?"
    return f"HEAD {head}, dropbox_eval sources sha256 {digest.hexdigest()[:12]}"


def fmt(value: float) -> str:
    """A number short enough for a table."""
    if value == int(value) and abs(value) < 1e12:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def emit(result: BenchResult, as_json: bool) -> None:
    """Print the result as a table (or JSON)."""
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    print(f"== {result.bench}: {result.command}")
    width = max((len(f.name) for f in result.figures), default=10)
    for figure in result.figures:
        value = f"{fmt(figure.value)} {figure.unit}".strip()
        target = f"target {figure.target}" if figure.target else ""
        line = f"  {figure.name:<{width}}  {value:>16}  {target:<18} {figure.verdict}"
        print(line.rstrip())
        if figure.note:
            print(f"  {'':<{width}}    ({figure.note})")
    for key, value in result.info.items():
        print(f"  {key}: {value}")
    print(
        f"  bench wall time: {result.seconds:.1f} s; load average at start "
        f"{START_LOAD[0]:.2f}; {machine_note()}"
    )
    print(f"  code: {code_version()}")


def make_tasks(count: int, prefix: str = "t") -> list[dict[str, Any]]:
    """`count` small but realistic tasks (title, body, two acceptance items)."""
    return [
        {
            "task_id": f"{prefix}{i}",
            "title": f"Evaluate case {i}",
            "body": f"Run scenario {i} against the candidate and report.",
            "acceptance": ["the scenario runs", "the report names the verdict"],
        }
        for i in range(count)
    ]


def settings_for(home: str, url: str, token: str, user: str, **extra: Any) -> Settings:
    """Product settings against a sandbox forge; clients are funded by the caller. Results
    finish at once (`settle_seconds` 0): settling is a wait, not work; poll.py measures it."""
    values: dict[str, Any] = {
        "home": home,
        "gitea_url": url,
        "gitea_token": token,
        "owner": user,
        "task_price": 0,
        "intake_concurrency": 4,
        "settle_seconds": 0,
    }
    values.update(extra)
    return load_settings(**values)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def rss_kib() -> tuple[int, int]:
    """(VmHWM, VmRSS) of this process in KiB, from /proc/self/status (0 if unavailable)."""
    peak = current = 0
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    current = int(line.split()[1])
    except OSError:
        pass
    return peak, current


class Stopwatch:
    """`with Stopwatch() as sw: ...; sw.seconds`."""

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.seconds = time.perf_counter() - self.start


class StoreIO:
    """Count the store's whole-file reads and writes (and their bytes) while active.

    Wraps `AtomicJSONStorage.read/write` (batches/, tasks/) and `ParsedFile.read/write`
    (index.json: read whole every time, parsed only when it changed) for measurement
    only; behaviour is unchanged. Appends to and reads of the archive's JSON-lines files are
    not counted.
    """

    def __init__(self) -> None:
        self.reads = self.writes = 0
        self.read_bytes = self.write_bytes = 0
        self.index_reads = self.index_writes = 0
        self._saved: tuple[Any, Any, Any, Any] | None = None

    def __enter__(self) -> StoreIO:
        from dropbox_eval.store.files import AtomicJSONStorage, ParsedFile

        counter = self

        def count(path: Path, *, written: bool) -> None:
            index = path.name == "index.json"
            size = 0
            with contextlib.suppress(OSError):
                size = os.path.getsize(path)
            if written:
                counter.writes, counter.index_writes = (
                    counter.writes + 1,
                    counter.index_writes + index,
                )
                counter.write_bytes += size
            else:
                counter.reads, counter.index_reads = counter.reads + 1, counter.index_reads + index
                counter.read_bytes += size

        saved_read, saved_write = AtomicJSONStorage.read, AtomicJSONStorage.write
        parsed_read, parsed_write = ParsedFile.read, ParsedFile.write

        def read(storage: Any) -> Any:
            data = saved_read(storage)
            count(storage._path, written=False)
            return data

        def write(storage: Any, data: Any) -> None:
            saved_write(storage, data)
            count(storage._path, written=True)

        def read_parsed(parsed: Any, path: Path) -> Any:  # the index: read whole, parsed if new
            data = parsed_read(parsed, path)
            count(path, written=False)
            return data

        def write_parsed(parsed: Any, path: Path, data: Any) -> None:
            parsed_write(parsed, path, data)
            count(path, written=True)

        self._saved = (saved_read, saved_write, parsed_read, parsed_write)
        AtomicJSONStorage.read = read  # type: ignore[method-assign,assignment]
        AtomicJSONStorage.write = write  # type: ignore[method-assign,assignment]
        ParsedFile.read = read_parsed  # type: ignore[method-assign,assignment]
        ParsedFile.write = write_parsed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from dropbox_eval.store.files import AtomicJSONStorage, ParsedFile

        assert self._saved is not None
        AtomicJSONStorage.read, AtomicJSONStorage.write = self._saved[:2]  # type: ignore[method-assign]
        ParsedFile.read, ParsedFile.write = self._saved[2:]  # type: ignore[method-assign]

    def summary(self) -> str:
        """`R reads (X MB, I of index.json), W writes (Y MB, J of index.json)`."""
        return (
            f"{self.reads} file reads ({self.read_bytes / 1e6:.2f} MB; "
            f"{self.index_reads} of index.json), {self.writes} writes "
            f"({self.write_bytes / 1e6:.2f} MB; {self.index_writes} of index.json)"
        )


def interleaved(
    count: int, first: Callable[[], First], second: Callable[[], Second]
) -> list[tuple[First, Second]]:
    """`count` pairs `(first(), second())`, run in alternating order (first then second,
    then second then first, ...) so that drift in the machine's load hits both alike."""
    pairs = []
    for index in range(count):
        if index % 2 == 0:
            one = first()
            two = second()
        else:
            two = second()
            one = first()
        pairs.append((one, two))
    return pairs


def add_median_ratio(result: BenchResult, name: str, ratios: list[float], at_most: float) -> float:
    """The median of per-pair ratios as a figure with the target `<= at_most`."""
    ratio = statistics.median(ratios)
    result.add(
        name,
        ratio,
        "x",
        f"<= {at_most:g}",
        ratio <= at_most,
        note="median of per-pair ratios " + ", ".join(f"{r:.2f}" for r in ratios),
    )
    return ratio


def median_ms(call: Callable[[], object], calls: int = 20) -> float:
    """Median milliseconds of `calls` calls, after one untimed call."""
    call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def paired_median_ms(
    first: Callable[[], object], second: Callable[[], object], calls: int = 20
) -> tuple[float, float]:
    """Median milliseconds of `calls` calls of each, after one untimed call of each, the
    calls alternating."""
    first()
    second()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for call, kept in zip((first, second), samples, strict=True):
            start = time.perf_counter()
            call()
            kept.append(time.perf_counter() - start)
    return statistics.median(samples[0]) * 1000, statistics.median(samples[1]) * 1000


def add_history_ratios(
    result: BenchResult,
    reads: dict[str, tuple[Callable[[], object], Callable[[], object]]],
    small: int,
    large: int,
    target: float = 1.2,
    calls: int = 20,
) -> None:
    """One figure per read: its median time with `large` archived batches over `small`,
    the calls of both alternating (a burst of load on the shared machine hits both)."""
    for name, (few, many) in reads.items():
        base, big = paired_median_ms(few, many, calls)
        result.add(
            f"{name}: {large} / {small} archived",
            big / base,
            "x",
            f"<= {target}",
            big / base <= target,
            note=f"{big:.2f} ms vs {base:.2f} ms",
        )
