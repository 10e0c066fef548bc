"""Which parts of a Python module run, read statically for forensics: how the interpreter reads the text (a BOM, a
PEP 263 coding line: parse_as_python), conditions whose truth is fixed (constants, version checks, `__name__`),
the dead branches and the functions neither an import nor the tests can call, and comparison dunders forged to
always agree. Runs no code and reports no finding itself (tasks/judge/forensics_python.py does).
"""

from __future__ import annotations

import ast
import builtins
from typing import Any

from tasks import pyast
from tasks.judge.forensics_context import Ctx
from tasks.judge.forensics_names import SUPPORTED


def _uses_name(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def truthy(e: ast.AST) -> bool:
    """An expression that is truthy whatever the operands (a constant, a non-empty display, `x or True`)."""
    if isinstance(e, ast.Constant):
        return bool(e.value)
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return bool(e.elts)
    if isinstance(e, ast.Dict):
        return bool(e.keys)
    if isinstance(e, ast.BoolOp):
        return any(truthy(v) for v in e.values) if isinstance(e.op, ast.Or) else all(truthy(v) for v in e.values)
    if isinstance(e, (ast.Lambda, ast.JoinedStr)):
        return isinstance(e, ast.Lambda) or any(isinstance(v, ast.Constant) and v.value for v in e.values)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        return falsy(e.operand)
    return False


def falsy(e: ast.AST | None) -> bool:
    if e is None:
        return True
    if isinstance(e, ast.Constant):
        return not e.value
    if isinstance(e, ast.Name):
        return e.id == "NotImplemented"  # Python then tries the other operand, then identity: honest
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        return truthy(e.operand)
    return False


def forged_cmp(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, dunder: str) -> bool:
    """A comparison dunder that answers the same whatever the other operand is (always equal / never unequal)."""
    a = fn.args
    other = a.args[1].arg if len(a.args) >= 2 else (a.vararg.arg if a.vararg else None)
    body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
    if isinstance(fn, ast.Lambda):
        rets: list[ast.AST | None] = [fn.body]
    else:
        rets = [n.value for b in body for n in ast.walk(b) if isinstance(n, ast.Return)] or [None]
    uses = other is not None and any(_uses_name(b, other) for b in body)
    if dunder == "__ne__":
        return all(falsy(r) and not isinstance(r, ast.Name) for r in rets) or (
            not uses and not all(truthy(r) for r in rets))
    return all(r is not None and truthy(r) for r in rets) or (not uses and not all(falsy(r) for r in rets))


def forged_value(v: ast.AST, dunder: str, funcs: dict[str, ast.FunctionDef]) -> bool:
    """A class attribute `__eq__ = V` (or a type() dict entry) whose V forges the comparison."""
    if isinstance(v, ast.Lambda):
        return forged_cmp(v, dunder)
    if isinstance(v, ast.Name):
        if v.id in funcs:
            return forged_cmp(funcs[v.id], dunder)
        return (v.id.startswith("__") and v.id != dunder) or v.id in dir(builtins)
    if isinstance(v, ast.Attribute):
        return v.attr != dunder
    if isinstance(v, ast.Call):
        return any(forged_value(a, dunder, funcs) for a in v.args)
    return False


def static_truth(test: ast.AST, importable: bool) -> bool | None:
    """True/False when a condition is the same on every supported Python and, for code the tests import,
    `__name__` is not '__main__'; None when it depends on run time."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        t = static_truth(test.operand, importable)
        return None if t is None else not t
    if isinstance(test, ast.BoolOp):
        vals = [static_truth(v, importable) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in vals else (True if all(v is True for v in vals) else None)
        return True if True in vals else (False if all(v is False for v in vals) else None)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        sides = (left, right)
        if importable and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides):
            other = right if isinstance(left, ast.Name) and left.id == "__name__" else left
            try:
                val = ast.literal_eval(other)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
            if isinstance(op, (ast.Eq, ast.Is, ast.NotEq, ast.IsNot)) and val == "__main__":
                return isinstance(op, (ast.NotEq, ast.IsNot))  # at import __name__ is never '__main__'
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(val, (tuple, list, set)) and val and \
                    all(v == "__main__" for v in val):
                return isinstance(op, ast.NotIn)
            return None
        if any(is_version(s) for s in sides):
            results = set()
            for ver in SUPPORTED:
                try:
                    lv = version_value(left, ver)
                    rv = version_value(right, ver)
                    fn = {ast.Lt: lambda x, y: x < y, ast.LtE: lambda x, y: x <= y, ast.Gt: lambda x, y: x > y,
                          ast.GtE: lambda x, y: x >= y, ast.Eq: lambda x, y: x == y,
                          ast.NotEq: lambda x, y: x != y}[type(op)]
                    results.add(bool(fn(lv, rv)))
                except (KeyError, TypeError, ValueError, SyntaxError, IndexError, MemoryError, RecursionError):
                    return None
            return results.pop() if len(results) == 1 else None
    return None


def is_version(n: ast.AST) -> bool:
    return "sys.version_info" in ast.unparse(n)


def version_value(n: ast.AST, ver: tuple[int, int]) -> Any:
    """sys.version_info (or a constant index, slice or .major/.minor of it) for version `ver`, else a literal."""
    vi = ver + (0, "final", 0)
    if ast.unparse(n) == "sys.version_info":
        return vi
    if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "sys.version_info":
        return vi[("major", "minor", "micro").index(n.attr)]
    if isinstance(n, ast.Subscript) and ast.unparse(n.value) == "sys.version_info":
        if isinstance(n.slice, ast.Slice):
            parts = [ast.literal_eval(p) if p is not None else None for p in (n.slice.lower, n.slice.upper,
                                                                               n.slice.step)]
            return vi[slice(*parts)]
        return vi[ast.literal_eval(n.slice)]
    return ast.literal_eval(n)


def dead_nodes(nodes: list[ast.AST], importable: bool) -> set[int]:
    """Ids of the nodes no import of the module runs: the dead branch of a static condition (`nodes`: the
    module's ast.walk, listed once per scan)."""
    dead: set[int] = set()
    for node in nodes:
        if isinstance(node, ast.If):
            t = static_truth(node.test, importable)
            branch = node.body if t is False else node.orelse if t is True else []
            for sub in branch:
                dead.update(id(n) for n in ast.walk(sub))
    return dead


def unreachable_functions(tree: ast.Module, nodes: list[ast.AST], ctx: Ctx, dead: set[int]) -> set[int]:
    """Ids of the nodes inside functions neither the import nor the tests can call (by name, transitively)."""
    defs: dict[str, list[ast.AST]] = {}
    owner: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.setdefault(node.name, []).append(node)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        owner[item.name] = node.name
    inside_def: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for sub in node.body:
                inside_def.update(id(n) for n in ast.walk(sub))
    refs = set(ctx.test_names)
    for node in nodes:
        if id(node) in inside_def or id(node) in dead:
            continue
        if isinstance(node, ast.Name):
            refs.add(node.id)
        elif isinstance(node, ast.Attribute):
            refs.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                refs.update(n.id for n in ast.walk(d) if isinstance(n, ast.Name))
            if node.decorator_list or (node.name.startswith("__") and node.name.endswith("__")):
                refs.add(node.name)  # registered by its decorator, or called by Python itself (module __getattr__)
    live: set[str] = set()
    todo = [r for r in refs if r in defs]
    while todo:
        name = todo.pop()
        if name in live:
            continue
        live.add(name)
        for d in defs[name]:
            for n in ast.walk(d):
                nm = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and owner.get(n.name) == name:
                    nm = n.name  # methods of a live class
                if nm in defs and nm not in live:
                    todo.append(nm)
    out: set[int] = set()
    for name, same_name in defs.items():
        if name in live:
            continue
        for d in same_name:
            if isinstance(d, ast.ClassDef):
                continue
            for sub in d.body:  # type: ignore[attr-defined]
                out.update(id(n) for n in ast.walk(sub))
    return out


def decodes_to_itself(code: str) -> bool:
    """True when the interpreter, reading this text's UTF-8 bytes as a file, gets this very text back: no BOM, no
    lone surrogate, and no word "coding" anywhere in the first two lines (however lines end), so no PEP 263
    declaration; the bytes then parse to the same tree and need no second parse."""
    if code.startswith("\ufeff"):
        return False
    ends = [i for i, ch in enumerate(code[:4096]) if ch in "\r\n"]
    head = code[:ends[3] if len(ends) > 3 else 4096]  # at least two lines, by any line ending Python knows
    if "coding" in head or len(ends) <= 3 and len(code) > 4096:
        return False
    try:
        code.encode("utf-8")
    except UnicodeError:
        return False
    return True


def parse_as_python(code: str) -> list[ast.Module]:
    """The module(s) Python may read from this text: the text itself (exec of a str, as the python tool runs
    it) and its UTF-8 bytes decoded as the interpreter decodes a file (a BOM, a PEP 263 coding line such as
    utf-7). Both when they differ; none when neither parses."""
    trees: list[ast.Module] = []
    dumps: set[str] = set()
    sources: list[str | bytes] = [code]
    if not decodes_to_itself(code):
        try:
            sources.append(code.encode("utf-8", "surrogatepass"))
        except UnicodeError:
            pass
    for src in sources:
        try:
            tree = pyast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError, LookupError, UnicodeError):
            continue
        try:
            d = ast.dump(tree)
        except RecursionError:
            continue
        if d not in dumps:
            dumps.add(d)
            trees.append(tree)
    return trees
