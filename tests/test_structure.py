"""The structure rules (docs: Architecture), checked on the sources: no import circle among
the product's modules (outside `cli/` and `sandbox/`); packages in layers, each importing
only its own layer's package or lower ones (no import back up, no stage importing a stage
beside it); no import of another package's private names; import chains of at most 12
modules; the composition root imported by at most 2 modules; one module decides retries
(the only one that imports tenacity)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dropbox_eval"
OUTSIDE = ("dropbox_eval.cli", "dropbox_eval.sandbox")
# each top-level part of the package and its layer: a module may import its own part and
# parts of lower layers only
LAYERS = {
    "errors": 0,
    "util": 1,
    "accounts": 2,  # the account models, re-exported by models
    **dict.fromkeys(("models", "config"), 3),
    **dict.fromkeys(("protocol", "ports"), 4),
    **dict.fromkeys(("store", "forge", "schemas"), 5),
    "billing": 6,
    **dict.fromkeys(("intake", "results"), 7),
    "lifecycle": 8,
    **dict.fromkeys(("delivery", "views"), 9),
    "ops": 10,
    **dict.fromkeys(("inbox", "sftp"), 11),
    **dict.fromkeys(("web", "workers", "sandbox"), 12),
    "service": 13,
    "app": 14,  # the composition root
    "cli": 15,
    "__main__": 16,
}
COMPOSITION_ROOT = "dropbox_eval.app"
# the hooks parts are given (besides every `on_*`): set only when a part is built
HOOK_NAMES = frozenset({"paused", "open_now", "retry_at", "report", "close", "cancel"})
LONGEST_CHAIN = 12


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


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_part_of_the_package_has_a_layer() -> None:
    assert sorted({_part(m) for m in MODULES} - {"__init__"} - LAYERS.keys()) == []


def test_no_import_back_up_and_no_part_imports_one_beside_it() -> None:
    crossings = sorted(
        f"{module} -> {target}"
        for module, targets in _graph(runtime_only=False).items()
        for target in targets
        if _part(module) != _part(target)
        and _part(module) in LAYERS
        and _part(target) in LAYERS
        and LAYERS[_part(target)] >= LAYERS[_part(module)]
    )
    assert crossings == []


def test_no_module_imports_another_package_s_private_names() -> None:
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            for target in _imported(module, node):
                private = [
                    a.name
                    for a in node.names
                    if a.name.startswith("_") and not a.name.endswith("__")
                ]
                if private and _part(target) != _part(module):
                    found.append(f"{module}: {target} {private}")
    assert found == []


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest import chain (the graph has no circle)."""
    memo: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in memo:
            below = [chain(n) for n in graph.get(node, ()) if not n.startswith(OUTSIDE)]
            memo[node] = [node, *max(below, key=len, default=[])]
        return memo[node]

    return max((chain(m) for m in graph if not m.startswith(OUTSIDE)), key=len)


def test_import_chains_are_short() -> None:
    longest = _longest_chain(_graph(runtime_only=True))
    assert len(longest) <= LONGEST_CHAIN, " -> ".join(longest)


def test_the_chain_finder_finds_the_longest_chain() -> None:
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": {"d"}, "d": set()}
    assert _longest_chain(graph) == ["a", "b", "c", "d"]


def _late_wiring(tree: ast.Module) -> Iterator[str]:
    """Assignments that give another object a hook or a collaborator after it was built:
    `x.on_done = ...`, `x.hook = lambda ...`, `self.part.hook = self.method`."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            own = isinstance(owner, ast.Name) and owner.id == "self"
            if own:
                continue
            hook = target.attr.startswith("on_") or target.attr in HOOK_NAMES
            if hook or isinstance(node.value, ast.Lambda):
                yield f"line {node.lineno}: {ast.unparse(target)} = {ast.unparse(node.value)}"


def test_no_part_is_wired_after_it_is_built() -> None:
    found = [
        f"{module} {line}"
        for module, path in MODULES.items()
        if module != COMPOSITION_ROOT and not module.startswith(OUTSIDE)
        for line in _late_wiring(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []


def test_the_late_wiring_finder_finds_hooks_given_later() -> None:
    source = "inbox.on_recorded = opener.offer\nself.part.paused = lambda: None\nx.count = 3\n"
    assert len(list(_late_wiring(ast.parse(source)))) == 2


def test_few_modules_import_the_composition_root() -> None:
    users = sorted(
        m for m, targets in _graph(runtime_only=False).items() if COMPOSITION_ROOT in targets
    )
    assert len(users) <= 2, users


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
    # the batches' and reports' retries are decided in attempts.py; the other is the
    # store's own: an operation cut by a lost database connection, run again within seconds
    assert users == ["dropbox_eval.lifecycle.attempts", "dropbox_eval.store.pg.rerun"]
