"""Split a test snippet into calls the sandbox evaluates and checks the host evaluates (the judge's data path).

A snippet splits when it is made only of asserts (plus constants, `import math`-style imports and assignments of
constants) in which every call of a solution function has arguments the host can evaluate on its own: `assert
f(1, [2]) == 3`, `assert abs(f(0.5) - 0.25) < 1e-6`, `assert not f('')`, `assert set(f(xs)) == {1, 2}`, and
HumanEval's `def check(candidate): ...` followed by `check(entry)`. Each such call becomes a `Call` (function name,
arguments as plain values); each assert becomes a `Check`, the assert's expression with the calls replaced by
placeholders, evaluated on the host over the decoded results with a small set of builtins and modules. The
expected values therefore never leave the host. Anything else (loops, helpers, try blocks, names the host does not
know, arguments that are not plain data) does not split: `plan` returns None and the test runs on the isolated
path (tasks/judge/guest/callserver.py). The snippets are the task author's code, trusted like the task file; only the decoded
results come from the sandbox. This module runs no sandbox.
"""

from __future__ import annotations

import ast
import builtins
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks import pyast
from tasks.judge.guest import plaindata

SAFE_BUILTINS = {n: getattr(builtins, n) for n in (
    "abs", "all", "any", "bool", "bytes", "chr", "complex", "dict", "divmod", "enumerate", "filter", "float",
    "frozenset", "hash", "int", "isinstance", "len", "list", "map", "max", "min", "ord", "pow", "range", "repr",
    "reversed", "round", "set", "sorted", "str", "sum", "tuple", "type", "zip", "True", "False", "None")}
MODULES = {"math": math}
PLACEHOLDER = "__fw_result_"


@dataclass
class Call:
    func: str
    args: list[Any]
    kwargs: dict[str, Any]


@dataclass
class Check:
    expr: ast.Expression
    source: str
    calls: list[int] = field(default_factory=list)  # indexes into Plan.calls that this check reads
    compare: tuple[int, Any] | None = None  # (call index, expected) when the check is `f(...) == EXPECTED`


@dataclass
class Plan:
    calls: list[Call] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)


class _NoSplit(Exception):
    pass


def _require_host_only(node: ast.AST, known: Callable[[str], bool]) -> None:
    """_NoSplit unless the host may evaluate `node` alone: no lambda, walrus or yield, only names `known` accepts,
    no underscore attributes."""
    for n in ast.walk(node):
        if isinstance(n, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            raise _NoSplit
        if isinstance(n, ast.Name) and not known(n.id):
            raise _NoSplit
        if isinstance(n, ast.Attribute) and n.attr.startswith("_"):
            raise _NoSplit


def _host_eval(node: ast.expr, env: dict[str, Any]) -> Any:
    """Evaluate a call-free expression of the test on the host; its value must be plain data."""
    _require_host_only(node, lambda name: name in env or name in SAFE_BUILTINS or name in MODULES)
    try:
        value = eval(pyast.compile_ast(ast.Expression(node), "<test>", "eval"),  # noqa: S307 - the task author's own test
                     {"__builtins__": SAFE_BUILTINS, **MODULES, **env})
        plaindata.encode(value)
    except Exception:  # noqa: BLE001 - anything the host cannot evaluate alone goes to the isolated path
        raise _NoSplit from None
    return value


def _statements(tree: ast.Module) -> tuple[list[ast.stmt], dict[str, str]]:
    """The snippet's statements, HumanEval's `def check(candidate): BODY; check(f)` unwrapped, and name aliases."""
    body = list(tree.body)
    last = body[-1] if body else None
    checks = [s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if (len(checks) == 1 and isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and isinstance(last.value.func, ast.Name) and last.value.func.id == "check"
            and len(last.value.args) == 1 and not last.value.keywords and isinstance(last.value.args[0], ast.Name)):
        fn = checks[0]
        a = fn.args
        if (len(a.args) != 1 or a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults
                or fn.decorator_list):
            raise _NoSplit
        rest = [s for s in body if s is not fn and s is not last]
        return rest + list(fn.body), {a.args[0].arg: last.value.args[0].id}
    if checks:
        raise _NoSplit
    return body, {}


def _import_of_known(s: ast.stmt, env: dict[str, Any]) -> bool:
    """`import math` (the host has it) or `from math import isclose` (bound in env); False for other imports."""
    if isinstance(s, ast.Import):
        return all(a.name in MODULES and a.asname is None for a in s.names)
    if isinstance(s, ast.ImportFrom) and s.module in MODULES and s.level == 0:
        mod = MODULES[s.module]
        if all(a.name != "*" and hasattr(mod, a.name) for a in s.names):
            env.update({a.asname or a.name: getattr(mod, a.name) for a in s.names})
            return True
    return False


def _star_import_of_solution(s: ast.stmt, module: str) -> bool:
    return isinstance(s, ast.ImportFrom) and s.module == module and [a.name for a in s.names] == ["*"]


def plan(code: str, *, module: str = "solution", entry_points: tuple[str, ...] = ()) -> Plan | None:
    """The data-path plan of one test snippet, or None when it must run on the isolated path."""
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return None
    try:
        return _plan(tree, module, set(entry_points))
    except (_NoSplit, RecursionError):
        return None


def _plan(tree: ast.Module, module: str, entry_points: set[str]) -> Plan:
    stmts, aliases = _statements(tree)
    p = Plan()
    n_asserts = 0
    for s in stmts:
        if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
            continue
        if _import_of_known(s, p.env) or _star_import_of_solution(s, module):
            continue
        if (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and not _calls_solution(s.value, p.env, aliases, entry_points)):
            p.env[s.targets[0].id] = _host_eval(s.value, p.env)
            continue
        if not isinstance(s, ast.Assert):
            raise _NoSplit
        n_asserts += 1
        p.checks.append(_check(s, p, aliases, entry_points))
    if not n_asserts:
        raise _NoSplit
    return p


def _solution_name(node: ast.expr, env: dict[str, Any], aliases: dict[str, str], entry_points: set[str]) -> str | None:
    """The solution function a call's target names (through the `candidate` alias), or None for a host name."""
    if not isinstance(node, ast.Name):
        return None
    name = aliases.get(node.id, node.id)
    if name in entry_points or node.id in aliases:
        return name
    if name in env or name in SAFE_BUILTINS or name in MODULES:
        return None
    return name


def _calls_solution(node: ast.expr, env: dict[str, Any], aliases: dict[str, str], entry_points: set[str]) -> bool:
    return any(isinstance(n, ast.Call) and _solution_name(n.func, env, aliases, entry_points) is not None
               for n in ast.walk(node))


class _Replace(ast.NodeTransformer):
    def __init__(self, p: Plan, aliases: dict[str, str], entry_points: set[str]):
        self.p, self.aliases, self.entry_points = p, aliases, entry_points
        self.used: list[int] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = _solution_name(node.func, self.p.env, self.aliases, self.entry_points)
        if name is None:
            return self.generic_visit(node)
        args: list[Any] = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                v = _host_eval(a.value, self.p.env)
                if not isinstance(v, (list, tuple)):
                    raise _NoSplit
                args.extend(v)
            else:
                args.append(_host_eval(a, self.p.env))
        kwargs: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg is None:
                raise _NoSplit
            kwargs[k.arg] = _host_eval(k.value, self.p.env)
        self.p.calls.append(Call(func=name, args=args, kwargs=kwargs))
        i = len(self.p.calls) - 1
        self.used.append(i)
        return ast.copy_location(ast.Name(id=f"{PLACEHOLDER}{i}", ctx=ast.Load()), node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.aliases or node.id in self.entry_points:
            raise _NoSplit  # the solution's function used as a value, not called
        return node


def _check(s: ast.Assert, p: Plan, aliases: dict[str, str], entry_points: set[str]) -> Check:
    source = ast.unparse(s.test)
    rep = _Replace(p, aliases, entry_points)
    expr = rep.visit(pyast.parse(source, mode="eval").body)
    ast.fix_missing_locations(expr)
    allowed = set(p.env) | set(SAFE_BUILTINS) | set(MODULES)
    _require_host_only(expr, lambda name: (name.startswith(PLACEHOLDER) or name in allowed
                                           or _bound_in_comprehension(expr, name)))
    compare = None
    if (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq)
            and isinstance(expr.left, ast.Name) and expr.left.id.startswith(PLACEHOLDER)):
        other = expr.comparators[0]
        if not any(isinstance(n, ast.Name) and n.id.startswith(PLACEHOLDER) for n in ast.walk(other)):
            compare = (int(expr.left.id[len(PLACEHOLDER):]), _host_eval(other, p.env))
    return Check(expr=ast.Expression(expr), source=source, calls=rep.used, compare=compare)


def _bound_in_comprehension(expr: ast.expr, name: str) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for g in n.generators:
                if any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(g.target)):
                    return True
    return False


def evaluate(check: Check, results: dict[int, Any], env: dict[str, Any], tolerance: float = 0.0) -> bool:
    """The check's truth over decoded results (plain values). Raises what the expression raises."""
    if check.compare is not None:
        i, expected = check.compare
        return plaindata.equal(results[i], expected, tolerance)
    ns = {"__builtins__": SAFE_BUILTINS, **MODULES, **env,
          **{f"{PLACEHOLDER}{i}": results[i] for i in check.calls}}
    code = pyast.compile_ast(check.expr, "<check>", "eval")
    return bool(eval(code, ns))  # noqa: S307 - the author's test over plain data
