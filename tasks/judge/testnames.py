"""Which names of the solution an isolated test may call (the judge's isolated path, tasks/judge/guest/runner.py).

`call_names(tests, module, entry_points)`: the names the tests' code reads (`f(...)`, `candidate = f`), the names they
import from the solution module (`from solution import f`) and the attributes they read on it (`solution.f`),
plus the entry points. The runner then proxies only those of them that the solution defines as callables and that
are entry points or are defined neither by the task's own code nor by the builtins, so a solution's `range`,
`sorted` or copy of a task helper never reaches the tests. `stubs(own_source)`: the functions the task's own code
leaves for the solution to write (a body of `pass`, `...` or `raise NotImplementedError`): like entry points, the
solution's versions of them are the ones the tests call. This module parses the task author's tests; it runs
nothing and does not know the solution.
"""

from __future__ import annotations

import ast

from tasks import pyast


def call_names(tests: list[str], module: str, entry_points: tuple[str, ...] = ()) -> list[str]:
    """Sorted names the tests may reach in the solution module, entry points included."""
    names: set[str] = set(entry_points)
    for code in tests:
        try:
            tree = pyast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # the runner reports the test's SyntaxError itself
        aliases = {module}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update(a.asname or a.name for a in node.names if a.name == module)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, ast.ImportFrom) and node.module == module and node.level == 0:
                names.update(a.name for a in node.names if a.name != "*")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases):
                names.add(node.attr)
    return sorted(n for n in names if not n.startswith("_"))


def _is_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
            body[0].value.value, str):
        body = body[1:]  # the docstring
    if len(body) != 1:
        return not body
    s = body[0]
    if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                   and s.value.value is Ellipsis):
        return True
    if isinstance(s, ast.Raise) and s.exc is not None:
        exc = s.exc.func if isinstance(s.exc, ast.Call) else s.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def stubs(own_source: str) -> list[str]:
    """Top-level functions of the task's own code that are stubs for the solution to write, sorted."""
    try:
        tree = pyast.parse(own_source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_stub(n))
