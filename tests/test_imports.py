"""The folders are the pipeline: imports run downward only and no module imports itself in a circle.

Every `import` and `from ... import` of the project's packages is read from the source (module level and inside
functions alike, since a lazy import is still a dependency) of every module, packages inside packages included
(`tasks/judge/verify.py` is the module `tasks.judge.verify`; a package's `__init__.py` is the package), and checked:
- package layers: flows -> training, curate -> agents -> tasks -> sandbox, warehouse; a package may import only
  packages below it (training and curate stand side by side and never import each other; nor do sandbox and
  warehouse);
- modules: no strongly connected component larger than one module (`from pkg import mod` depends on the module
  `pkg.mod`, not on the package's `__init__`);
- benchmarks/ and scripts/ may import any package, but only what exists: the module, and each name it imports
  from it (a submodule or a name the module defines at top level);
- the judge (tasks/judge/) is reached through its public names: nothing outside it imports a private (`_x`) name
  or module of it (tests/ included);
- only flows/ imports prefect; only tasks/pyast.py and the in-sandbox programs call ast.parse; the in-sandbox
  programs in a `guest/` folder import the standard library only.
Run it alone with `pytest tests/test_imports.py -q`; a failure names the offending imports."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"flows": 4, "training": 3, "curate": 3, "agents": 2, "tasks": 1, "sandbox": 0, "warehouse": 0}
IMPORTERS = ("benchmarks", "scripts")  # folders of programs that may import any package
JUDGE = "tasks.judge"
ONLY_FLOWS_IMPORT = ("prefect", "prefect_ray")

# Programs that run INSIDE a sandbox (one thread, standard library only), where tasks/pyast.py is not at hand.
# One line per program (path: what it is); helpers that add in-sandbox programs add their lines here.
IN_SANDBOX = {
    "tasks/guest/testrunner.py": "the run_tests harness",
    "tasks/guest/testworker.py": "the run_tests harness's worker",
    "tasks/guest/snapshot.py": "the workspace snapshot",
    "tasks/guest/bfcl_check.py": "BFCL's checker on one episode",
    "tasks/guest/bfcl_call.py": "one call of a BFCL task's API",
    "tasks/factory/guest/ledger_solve.py": "the oracle of a ledger task (synthesized)",
    "tasks/factory/guest/ledger_check.py": "the check of a ledger task (synthesized)",
    "tasks/factory/guest/perturb.py": "the perturbed oracles of a Harbor task",
    "tasks/judge/guest/plaindata.py": "the judge's plain-data encoding (also imported on the host)",
    "tasks/judge/guest/callserver.py": "the judge's call server",
    "tasks/judge/guest/runner.py": "the judge's isolated runner",
    "sandbox/guest/boot.py": "the loader that installs the sandbox's guest modules from the command line",
    "sandbox/guest/kernel.py": "the warm interpreter (kernel)",
    "sandbox/guest/zygote.py": "the local backend's zygote",
    "sandbox/guest/keeper.py": "the Docker backend's keeper",
    "sandbox/guest/reset.py": "the reset check and restore",
    "sandbox/guest/cleanup.py": "the Docker backend's cleanup",
    "sandbox/guest/holder.py": "the local sandbox's namespace holder",
    "sandbox/guest/enter.py": "the local sandbox's enter helper",
    "sandbox/guest/pid1.py": "the sandbox's PID 1",
    "sandbox/guest/write.py": "the file writer",
}
# What is shipped into a sandbox beside the guest modules (the only non-stdlib names they may import): sandbox/programs.py's.
SHIPPED_WITH_GUESTS = ("sandbox.procfs", "sandbox.guest.",
                       "bfcl_eval.")  # the wheel's modules tasks/bfcl.py writes beside its two programs


def _files(folders: tuple[str, ...]) -> dict[str, Path]:
    """module name -> file, for every Python file under `folders` (packages inside packages included)."""
    out = {}
    for folder in folders:
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _rel(f: Path) -> str:
    return f.relative_to(ROOT).as_posix()


@cache
def _tree(f: Path) -> ast.Module:
    return ast.parse(f.read_text(), filename=str(f))


@cache
def _module_file(name: str) -> Path | None:
    """The file of a project module or package `name`, or None when there is none."""
    base = ROOT / name.replace(".", "/")
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _project_imports(f: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import of a project package in `f`; names is empty for `import m`."""
    out = []
    for node in ast.walk(_tree(f)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in LAYERS:
                out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] in LAYERS]
    return out


def _imports() -> dict[str, dict[str, int]]:
    """module -> {imported project module: line}. `from m import x` depends on the module m.x when there is one,
    else on m."""
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for mod, f in _files(tuple(LAYERS)).items():
        for line, module, names in _project_imports(f):
            targets = [module] if not names else [
                f"{module}.{n}" if _module_file(f"{module}.{n}") else module for n in names]
            for target in targets:
                if _module_file(target) and target != mod:
                    graph[mod].setdefault(target, line)
    return graph


@cache
def _defined(f: Path) -> frozenset[str]:
    """Names a module binds at top level (in if/try/with blocks too): defs, classes, assignments, imports."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(s.name)
            elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in s.names)
            if isinstance(s, (ast.If, ast.Try, ast.With)):
                visit(s.body + getattr(s, "orelse", []) + getattr(s, "finalbody", []) + [
                    x for h in getattr(s, "handlers", []) for x in h.body])

    visit(_tree(f).body)
    return frozenset(names)


def test_packages_import_only_downward():
    wrong = []
    for mod, targets in _imports().items():
        a = mod.split(".")[0]
        for target, line in targets.items():
            b = target.split(".")[0]
            if a != b and LAYERS[b] >= LAYERS[a]:
                wrong.append(f"{_rel(_module_file(mod))}:{line} imports {target} ({a} may not import {b})")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_subpackages_are_walked():
    """The walk reaches packages inside packages (the judge), so the rules above hold there too."""
    graph = _imports()
    assert f"{JUDGE}.verify" in graph and f"{JUDGE}.unittests" in graph[f"{JUDGE}.verify"]
    assert f"{JUDGE}.api" in graph.get("agents.loop", {})


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


def test_benchmarks_and_scripts_import_what_exists():
    missing = []
    for f in _files(IMPORTERS).values():
        for line, module, names in _project_imports(f):
            target = _module_file(module)
            if target is None:
                missing.append(f"{_rel(f)}:{line} imports {module}: no such module")
                continue
            missing += [f"{_rel(f)}:{line} imports {module}.{n}: not defined there" for n in names
                        if n != "*" and not _module_file(f"{module}.{n}") and n not in _defined(target)]
    assert not missing, "\n".join(missing)


def test_nothing_outside_the_judge_imports_its_private_names():
    private = []
    for mod, f in _files((*LAYERS, *IMPORTERS, "tests")).items():
        if mod == JUDGE or mod.startswith(JUDGE + "."):
            continue
        for line, module, names in _project_imports(f):
            if module != JUDGE and not module.startswith(JUDGE + "."):
                continue
            parts = module.split(".") + names
            private += [f"{_rel(f)}:{line} imports {module} {p}" for p in parts if p.startswith("_")]
    assert not private, "private names of the judge imported from outside it:\n" + "\n".join(private)


def _external(prefixes: tuple[str, ...]) -> list[str]:
    out = []
    for mod, f in _files(tuple(LAYERS)).items():
        if mod.split(".")[0] == "flows":
            continue
        for node in ast.walk(_tree(f)):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            out += [f"{_rel(f)}:{node.lineno} imports {m}" for m in mods if m.split(".")[0] in prefixes]
    return out


def test_only_flows_imports_prefect():
    assert not _external(ONLY_FLOWS_IMPORT), _external(ONLY_FLOWS_IMPORT)


def test_in_sandbox_programs_exist_and_guest_programs_import_the_standard_library_only():
    """Every IN_SANDBOX path exists; those in a `guest/` folder (programs that run only inside a sandbox, shipped
    as source) import nothing but the standard library and what is shipped with them (SHIPPED_WITH_GUESTS)."""
    gone = [p for p in IN_SANDBOX if not (ROOT / p).is_file()]
    assert not gone, f"IN_SANDBOX names programs that do not exist: {gone}"
    outside = []
    for rel in (p for p in IN_SANDBOX if "/guest/" in p):
        for node in ast.walk(_tree(ROOT / rel)):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [f"{node.module or ''}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            outside += [f"{rel}:{node.lineno} imports {m}" for m in mods
                        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "__future__"
                        and not m.startswith(SHIPPED_WITH_GUESTS)]
    assert not outside, f"in-sandbox programs import more than the standard library: {outside}"


def test_host_code_parses_python_through_the_locked_parser():
    """CPython 3.11's AST constructor keeps its recursion depth interpreter-wide (python/cpython#106905): two threads
    in ast.parse at once can raise `SystemError: AST constructor recursion depth mismatch` (seen in CI from BFCL's
    checker files, parsed by four threads). Host code parses through tasks/pyast.py's lock; only it and the
    in-sandbox programs call ast.parse."""
    direct = []
    for f in _files(tuple(LAYERS)).values():
        rel = _rel(f)
        if rel in IN_SANDBOX or rel == "tasks/pyast.py":
            continue
        for node in ast.walk(_tree(f)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"):
                direct.append(f"{rel}:{node.lineno}")
    assert direct == [], f"ast.parse outside tasks/pyast.py (use pyast.parse): {direct}"


def test_every_package_folder_is_installed():
    """pyproject's [tool.setuptools] packages names every folder of the project's packages that holds an
    __init__.py, so a plain (non-editable) install carries it and the guest programs read from it at run time."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {str(p.parent.relative_to(ROOT)).replace("/", ".") for pkg in LAYERS
               for p in (ROOT / pkg).rglob("__init__.py")}
    assert folders - listed == set(), f"package folders pyproject.toml does not install: {sorted(folders - listed)}"
