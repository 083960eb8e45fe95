"""The README's structure rule, checked on the sources: no import circle among the
product's modules (outside `cli/` and `sandbox/`), no stage module imports another, and
one module decides retries (the only one that imports tenacity)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dropbox_eval"
OUTSIDE = ("dropbox_eval.cli", "dropbox_eval.sandbox")
STAGES = ("inbox", "intake", "poller", "settle", "lifecycle", "delivery")


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in PACKAGE.rglob("*.py")}


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The product modules an import statement loads (`from . import x` loads x, not the
    package it names)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & MODULES.keys()
    prefix = node.module or ""
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    names = {f"{prefix}.{alias.name}" for alias in node.names}
    found = names & MODULES.keys()
    return found | ({prefix} & MODULES.keys() if found != names else set())


def _runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module loads (not those in functions or under TYPE_CHECKING)."""
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, ast.Try | ast.If) else [node]:
            if isinstance(inner, ast.Import | ast.ImportFrom):
                yield inner


def _graph(runtime_only: bool) -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = (
            _runtime_imports(tree)
            if runtime_only
            else (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
        )
        graph[module] = set().union(*(_imported(module, n) for n in nodes)) - {module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), outside cli/, sandbox/."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(OUTSIDE):
                continue
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in order and not node.startswith(OUTSIDE):
            visit(node)
    return circles


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def test_no_import_circle_among_the_products_modules() -> None:
    assert _circles(_graph(runtime_only=True)) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_stage_imports_another_stage() -> None:
    crossings = sorted(
        f"{module} -> {target}"
        for module, targets in _graph(runtime_only=False).items()
        for target in targets
        if _stage(module) and _stage(target) and _stage(module) != _stage(target)
    )
    assert crossings == []


def test_one_module_decides_retries() -> None:
    users = sorted(
        name
        for name, path in MODULES.items()
        if any(
            (isinstance(n, ast.Import) and any(a.name.startswith("tenacity") for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tenacity"))
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )
    assert users == ["dropbox_eval.attempts"]
