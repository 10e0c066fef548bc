"""Which names of the solution an isolated test may call (the judge's isolated path, tasks/judgebox.py's runner).

`call_names(tests, module, entry_points)`: the names the tests' code reads (`f(...)`, `candidate = f`), the names they
import from the solution module (`from solution import f`) and the attributes they read on it (`solution.f`),
plus the entry points. The runner then proxies only those of them that the solution defines as callables and that
are entry points or are defined neither by the task's own code nor by the builtins, so a solution's `range`,
`sorted` or copy of a task helper never reaches the tests. This module parses the task author's tests; it runs
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
