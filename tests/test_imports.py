"""The folders are the pipeline: imports run downward only and no module imports itself in a circle.

Every `import` and `from ... import` of the project's packages is read from the source (module level and inside
functions alike, since a lazy import is still a dependency), and the graph is checked two ways:
- package layers: flows -> training, curate -> agents -> tasks -> sandbox, warehouse; a package may import only
  packages below it (training and curate stand side by side and never import each other; nor do sandbox and
  warehouse);
- modules: no strongly connected component larger than one module.
Run it alone with `pytest tests/test_imports.py -q`; a failure names the offending imports."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"flows": 4, "training": 3, "curate": 3, "agents": 2, "tasks": 1, "sandbox": 0, "warehouse": 0}
ONLY_FLOWS_IMPORT = ("prefect", "prefect_ray")


def _imports() -> dict[str, dict[str, int]]:
    """module -> {imported project module: line}."""
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for pkg in LAYERS:
        for f in sorted((ROOT / pkg).glob("*.py")):
            mod = f"{pkg}.{f.stem}"
            for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in LAYERS and (ROOT / (name.replace(".", "/") + ".py")).exists():
                        graph[mod].setdefault(name, node.lineno)
    return graph


def _external(prefixes: tuple[str, ...]) -> list[str]:
    out = []
    for pkg in LAYERS:
        if pkg == "flows":
            continue
        for f in sorted((ROOT / pkg).glob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                out += [f"{pkg}/{f.name}:{node.lineno} imports {m}" for m in mods if m.split(".")[0] in prefixes]
    return out


def test_packages_import_only_downward():
    wrong = []
    for mod, targets in _imports().items():
        a = mod.split(".")[0]
        for target, line in targets.items():
            b = target.split(".")[0]
            if a != b and LAYERS[b] >= LAYERS[a]:
                wrong.append(f"{mod.replace('.', '/')}.py:{line} imports {target} ({a} may not import {b})")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_no_module_circles():
    graph = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not circles, "modules that import each other (directly or around a circle): " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_only_flows_imports_prefect():
    assert not _external(ONLY_FLOWS_IMPORT), _external(ONLY_FLOWS_IMPORT)
