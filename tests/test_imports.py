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


# Programs that run INSIDE a sandbox (one thread, standard library only), where tasks/pyast.py is not at hand.
IN_SANDBOX = {"tasks/testrunner.py": "the run_tests harness", "sandbox/interpreter.py": "the warm interpreter",
              "sandbox/guest/kernel.py": "the warm interpreter (kernel)"}


def test_host_code_parses_python_through_the_locked_parser():
    """CPython 3.11's AST constructor keeps its recursion depth interpreter-wide (python/cpython#106905): two threads
    in ast.parse at once can raise `SystemError: AST constructor recursion depth mismatch` (seen in CI from BFCL's
    checker files, parsed by four threads). Host code parses through tasks/pyast.py's lock; only it and the
    in-sandbox programs call ast.parse."""
    direct = []
    for pkg in LAYERS:
        for f in sorted((ROOT / pkg).glob("*.py")):
            rel = f"{pkg}/{f.name}"
            if rel in IN_SANDBOX or rel == "tasks/pyast.py":
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"):
                    direct.append(f"{rel}:{node.lineno}")
    assert direct == [], f"ast.parse outside tasks/pyast.py (use pyast.parse): {direct}"
