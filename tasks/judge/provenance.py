"""Where a numeric answer came from: static provenance of the required tool's output (forensics' no_tool_use).

A numeric task that requires a tool rewards an answer only when the tool computed it from the problem's own
quantities (the numbers the prompt gives), not when a call merely shows a number the model chose. For one call of
the python tool whose output shows the answer, three static checks (`python_call`), all over the call's code with
the code of the episode's earlier calls of the tool as context (the interpreter keeps its names across calls):

- literal carrier: a value built only from constants the model chose, folded (`600 + 36`, `int('636')`,
  `'6' + '36'`, `f'{600 + 36}'`, `list(range(630, 640))`, `eval('600+36')`, `math.factorial(6) - 84`), that reaches
  an output unchanged (through containers, string building and formatting, conversions, conditionals, subscripts,
  names and the returns of the code's own functions) and shows the answer. Outputs: print, the echoed last
  expression, sys.stdout/stderr.write, a raised exception or an assert's message, sys.exit, warnings and logging,
  a command run by os.system/subprocess, and code run by exec() of a string the folder can read;
- data dependence: some output of the call depends on a quantity, through names bound in this or an earlier call,
  loops, comprehensions and helper functions (a constant combined WITH a quantity, like `h * 60`, is data);
- not a constant in disguise: when an output the folder can evaluate shows the answer only because of constants
  (`a * 0 + 636`), changing the quantities leaves it showing the answer, and it does not count; when every
  data-dependent output folds to something that does not show the answer, the answer came from elsewhere (an
  exception message, a name in an error) and the call does not count.

A constant equal to one of the prompt's numbers is a quantity, never a literal: an answer the prompt itself gives may
be printed as written. Other tools (`other_call`, e.g. a shell command or a calculator's expression): an argument that
shows the answer, or folds to it as a Python expression without the quantities, is a literal. What a static reading
cannot see (a computation the folder cannot evaluate, built only from constants, printed beside a data-dependent
output) stays possible; forensics are evidence, not the only wall. This module runs no code and judges nothing by
itself: forensics_messages.untraced_answer turns its reasons into the no_tool_use finding. The numbers, the
quantities, the numeric folder and the moved-quantity worlds it reads with are tasks/judge/quantities.py.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from tasks import pyast
from tasks.judge.constfold import MAX_LEN, UNKNOWN, Hole
from tasks.judge.quantities import (
    Answer,
    NumericFolder,
    fold_expr,
    is_quantity,
    moved_worlds,
    numbers_in,
    shifted,
)

# ------------------------------------------------------------------------------------------ the episode code

_OUT_CALLS = {"print", "pprint", "exit", "quit", "system", "popen", "run", "call", "check_call", "check_output",
              "Popen", "getoutput", "getstatusoutput", "warn", "debug", "info", "warning", "error", "critical",
              "exception", "log", "display", "spawnl", "spawnlp", "execl", "execlp", "execv", "execvp"}
_OUT_WRITES = {"sys.stdout.write", "sys.stderr.write", "sys.stdout.writelines", "sys.stderr.writelines",
               "os.write", "sys.__stdout__.write", "sys.__stderr__.write"}
# calls whose result carries what their arguments carry (conversions, containers, formatting, eval)
_TRANSPARENT = {"str", "int", "float", "repr", "ascii", "format", "list", "tuple", "set", "frozenset", "sorted",
                "reversed", "dict", "eval", "Decimal", "Fraction", "bytes", "bytearray", "abs", "round", "iter",
                "next", "enumerate", "zip", "chain", "dumps", "literal_eval", "loads", "deepcopy", "copy", "max", "min"}
_PURE = {"print", "str", "int", "float", "len", "sum", "min", "max", "abs", "round", "sorted", "list", "tuple", "range",
         "repr", "format", "divmod", "pow", "bool", "set", "reversed", "enumerate", "zip"}
_MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault", "appendleft", "extendleft", "push",
             "__setitem__", "put"}
_STR_METHODS = {"format", "join", "replace", "strip", "lstrip", "rstrip", "upper", "lower", "center", "ljust",
                "rjust", "zfill", "encode", "decode", "format_map", "split", "copy"}


_FILES = "<files>"  # the files the code writes, as one name: data once any write of data, read back as data
_FILE_WRITES = {"write", "writelines", "write_text", "write_bytes", "dump", "dumps", "save", "savetxt", "to_csv",
                "writerow", "writerows", "send", "sendall", "put"}
_FILE_READS = {"read", "readline", "readlines", "read_text", "read_bytes", "load", "loadtxt", "read_csv", "recv",
               "get", "getvalue", "check_output", "getoutput", "communicate"}


def _short(call: ast.Call) -> str:
    """The called name's last part: `write` of f.write(...), `open` of open(...)."""
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _names(target: ast.AST) -> Iterator[str]:
    """Names a binding target binds (for subscripts and attributes, the base name, since a store mutates it)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for e in target.elts:
            yield from _names(e)
    elif isinstance(target, (ast.Starred, ast.Subscript, ast.Attribute)):
        yield from _names(target.value)


def _combined(codes: list[str]) -> ast.Module | None:
    """The episode's calls as one module in call order (code that does not parse ran nothing)."""
    body: list[ast.stmt] = []
    line = 0
    for code in codes:
        try:
            tree = pyast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeError):
            continue
        ast.increment_lineno(tree, line)
        line = max([getattr(n, "end_lineno", 0) or 0 for n in ast.walk(tree)] + [line]) + 1
        body.extend(tree.body)  # type: ignore[attr-defined]
    return ast.Module(body=body, type_ignores=[]) if body else None


class _Code:
    """One call's code with the earlier calls' code before it: bindings, data dependence, outputs, carriers."""

    def __init__(self, tree: ast.Module, first: int, answer: Answer):
        self.tree, self.first, self.answer = tree, first, answer
        self.bindings: dict[str, list[ast.AST]] = {}
        self.accumulators: set[str] = set()
        self.functions: dict[str, list[ast.AST]] = {}
        self._collect()
        self.folder = NumericFolder(tree)
        self.data = self._data_names()

    # -------------------------------------------------------------------------------------------- bindings
    def _bind(self, names: Iterator[str], value: ast.AST) -> None:
        for n in names:
            self.bindings.setdefault(n, []).append(value)

    def _collect(self) -> None:
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    self._bind(_names(t), n.value)
            elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                self._bind(_names(n.target), n.value)
                if isinstance(n, ast.AugAssign):
                    self.accumulators.update(_names(n.target))
            elif isinstance(n, ast.NamedExpr):
                self._bind(_names(n.target), n.value)
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._bind(_names(n.target), n.iter)
            elif isinstance(n, (ast.With, ast.AsyncWith)):
                for item in n.items:
                    if item.optional_vars is not None:
                        self._bind(_names(item.optional_vars), item.context_expr)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._bind(iter([n.name]), n)
                self.functions.setdefault(n.name, []).append(n)
            elif isinstance(n, ast.Call):
                # what a call writes to a file (or pickles, dumps) the code may read back: files are one name
                if _short(n) in _FILE_WRITES:
                    self._bind(iter([_FILES]), n)
                # a method that mutates its object (xs.append(a), d.update(...)) binds the object's name
                if isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and \
                        n.func.attr in _MUTATORS:
                    self._bind(iter([n.func.value.id]), n)
                # a local function's parameters take what its callers pass
                if isinstance(n.func, ast.Name):
                    for fn in ast.walk(self.tree):
                        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == n.func.id:
                            params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
                            self._bind(iter(params), n)
            elif isinstance(n, ast.Lambda):
                for a in n.args.args:
                    self._bind(iter([a.arg]), n)

    def _data_names(self) -> set[str]:
        data: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, values in self.bindings.items():
                if name not in data and any(self._depends(v, data) for v in values):
                    data.add(name)
                    changed = True
        return data

    def _depends(self, node: ast.AST, data: set[str]) -> bool:
        q = self.answer.quantities
        for n in ast.walk(node):
            if isinstance(n, ast.Constant) and is_quantity(n.value, q):
                return True
            if isinstance(n, ast.Name) and n.id in data:
                return True
            if isinstance(n, ast.Call) and _FILES in data and _short(n) in _FILE_READS:
                return True
        return False

    def is_data(self, node: ast.AST) -> bool:
        """The expression depends on a prompt quantity (a constant equal to one, or a name bound from one)."""
        return self._depends(node, self.data)

    # --------------------------------------------------------------------------------------------- outputs
    def _current(self) -> list[ast.stmt]:
        return self.tree.body[self.first:]

    def outputs(self) -> list[ast.AST]:
        """The expressions whose values this call's code shows (see the module docstring)."""
        out: list[ast.AST] = []
        body = self._current()
        for stmt in body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Call):
                    name = self.folder.dotted(n.func)
                    short = name.rsplit(".", 1)[-1] if name else (
                        n.func.attr if isinstance(n.func, ast.Attribute) else "")
                    if short in _OUT_CALLS or name in _OUT_WRITES:
                        out.extend(a.value if isinstance(a, ast.Starred) else a for a in n.args)
                        out.extend(k.value for k in n.keywords if k.arg in (None, "args", "msg", "message"))
                    elif short in ("exec", "eval") and n.args:
                        out.extend(self._exec_outputs(n.args[0]))
                elif isinstance(n, ast.Raise) and n.exc is not None:
                    out.append(n.exc)
                elif isinstance(n, ast.Assert) and n.msg is not None:
                    out.append(n.msg)
        if body and isinstance(body[-1], ast.Expr) and not self._is_output_call(body[-1].value):
            out.append(body[-1].value)  # the interpreter echoes the last expression's repr
        return out

    def _is_output_call(self, node: ast.AST) -> bool:
        """print(...) and the like: what they show is their arguments (the echo of their None shows nothing)."""
        if not isinstance(node, ast.Call):
            return False
        name = self.folder.dotted(node.func)
        return name.rsplit(".", 1)[-1] in _OUT_CALLS or name in _OUT_WRITES

    def _exec_outputs(self, arg: ast.AST) -> list[ast.AST]:
        """exec()/eval() of a string the folder can read: its outputs, analysed as code of its own."""
        text = self.folder.fold(arg)
        if not isinstance(text, str) or isinstance(text, Hole):
            return [arg]
        try:
            sub = pyast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return [arg]
        inner = _Code(ast.Module(body=list(self.tree.body) + list(sub.body), type_ignores=[]),  # type: ignore
                      len(self.tree.body), self.answer)
        return [arg, *inner.outputs()]

    # -------------------------------------------------------------------------------------------- carriers
    def carriers(self, node: ast.AST, seen: set[int] | None = None) -> list[Any]:
        """Values built only from the model's constants that reach this expression's value unchanged."""
        seen = set() if seen is None else seen
        if id(node) in seen or len(seen) > 2000:
            return []
        seen.add(id(node))
        if not self.is_data(node) and not isinstance(node, (ast.Lambda, ast.FunctionDef)):
            v = self.folder.fold(node)
            if v is not UNKNOWN and not isinstance(v, Hole):
                return [v]
        if isinstance(node, ast.Constant):
            return [] if is_quantity(node.value, self.answer.quantities) and not isinstance(node.value, str) \
                else [node.value]
        kids: list[ast.AST] = []
        if isinstance(node, ast.Name):
            if node.id in self.accumulators:  # total = 0; ... total += x: the 0 is where a sum starts
                kids = [v for v in self.bindings.get(node.id, []) if self.is_data(v)]
            else:
                kids = list(self.bindings.get(node.id, []))
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            kids = list(node.elts)
        elif isinstance(node, ast.Dict):
            kids = [k for k in node.keys if k is not None] + list(node.values)
        elif isinstance(node, ast.JoinedStr):
            kids = list(node.values)
        elif isinstance(node, (ast.FormattedValue, ast.Starred, ast.NamedExpr)):
            kids = [node.value]
        elif isinstance(node, ast.IfExp):
            kids = [node.body, node.orelse]
        elif isinstance(node, ast.BoolOp):
            kids = list(node.values)
        elif isinstance(node, ast.Subscript):
            kids = [node.value]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            kids = [node.elt]
        elif isinstance(node, ast.DictComp):
            kids = [node.key, node.value]
        elif isinstance(node, (ast.For, ast.comprehension)):
            kids = [node.iter]
        elif isinstance(node, ast.BinOp) and self._stringy(node):
            kids = [node.left, node.right]
        elif isinstance(node, ast.Call):
            kids = self._call_kids(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kids = [node.body] if isinstance(node, ast.Lambda) else [
                r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
        out: list[Any] = []
        for k in kids:
            out.extend(self.carriers(k, seen))
        return out

    def _stringy(self, node: ast.BinOp) -> bool:
        """String building: '6' + '36', '%d' % x (a number added to a number is arithmetic, not carried)."""
        if not isinstance(node.op, (ast.Add, ast.Mod)):
            return False
        for side in (node.left, node.right):
            v = self.folder.fold(side)
            if isinstance(v, (str, bytes)) or isinstance(side, ast.JoinedStr):
                return True
        return False

    def _call_kids(self, node: ast.Call) -> list[ast.AST]:
        name = self.folder.dotted(node.func)
        short = name.rsplit(".", 1)[-1] if name else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
        args = [a for a in node.args] + [k.value for k in node.keywords]
        if short in _TRANSPARENT or short.endswith(("Error", "Exception", "Warning")) or short in _OUT_CALLS:
            return args
        if isinstance(node.func, ast.Attribute) and short in _STR_METHODS:
            return [node.func.value, *args]
        if isinstance(node.func, ast.Name) and node.func.id in self.functions:
            return list(self.functions[node.func.id])
        if isinstance(node.func, ast.Lambda):
            return [node.func]
        return []

    # ------------------------------------------------------------------------------------- semantic constant
    def folded_outputs(self, world: tuple[str, int] | None) -> list[Any]:
        """Each output folded in a world (None: the quantities as given; (mode, k): only the k-th moved, Shift),
        UNKNOWN where the folder cannot be sure: names bound inside loops, branches, functions or by exec."""
        tree = shifted(self.tree, world, self.answer.quantities) if world else self.tree
        code = _Code.__new__(_Code)
        code.tree, code.first, code.answer = tree, self.first, self.answer
        code.folder = NumericFolder()
        code.folder.aliases = {}
        straight = _straight_line_env(tree, code.folder)
        if straight is None:
            return [UNKNOWN] * len(self.outputs())
        values = []
        for node, env in straight.outputs_with_env(code):
            code.folder.env = env
            values.append(code.folder.fold(node) if env is not None else UNKNOWN)
        return values


class _Straight:
    def __init__(self, tree: ast.Module, folder: NumericFolder, poisoned: set[str]):
        self.tree, self.folder, self.poisoned = tree, folder, poisoned

    def outputs_with_env(self, code: _Code) -> list[tuple[ast.AST, dict[str, Any] | None]]:
        """(output, the names' values just before its statement) in the order _Code.outputs lists them."""
        env: dict[str, Any] = {}
        before: dict[int, dict[str, Any]] = {}
        top: dict[int, int] = {}
        for i, stmt in enumerate(self.tree.body):
            before[i] = dict(env)
            for n in ast.walk(stmt):
                top[id(n)] = i
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                self.folder.env = env
                if isinstance(stmt, ast.Assign):
                    v = self.folder.fold(stmt.value)
                    for t in stmt.targets:
                        if isinstance(t, (ast.Name, ast.Tuple, ast.List)):
                            self.folder._bind_target(t, v, stmt.value)
                        else:
                            for nm in _names(t):
                                env[nm] = UNKNOWN
                elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                    env[stmt.target.id] = self.folder._binop(stmt.op, env.get(stmt.target.id, UNKNOWN),
                                                             self.folder.fold(stmt.value))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                    env[stmt.target.id] = self.folder.fold(stmt.value)
            for nm in self.poisoned:
                env[nm] = UNKNOWN
        out: list[tuple[ast.AST, dict[str, Any] | None]] = []
        for node in _Code.outputs(code):
            i = top.get(id(node))
            stmt = self.tree.body[i] if i is not None else None
            simple = stmt is not None and isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.Raise,
                                                            ast.Assert, ast.AnnAssign))
            out.append((node, before[i] if simple and i is not None else None))
        return out


def _straight_line_env(tree: ast.Module, folder: NumericFolder) -> _Straight | None:
    """Names bound anywhere but a top-level statement (loops, branches, functions, walrus, imports) never fold;
    code that runs exec or reaches globals() folds nothing."""
    poisoned: set[str] = set()
    for stmt in tree.body:
        simple = isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.Assert))
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call) and folder.dotted(n.func).rsplit(".", 1)[-1] in (
                    "exec", "globals", "locals", "vars", "setattr", "__import__", "__dict__"):
                return None
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and not simple:
                poisoned.add(n.id)
            if not simple and isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                for t in n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]:
                    poisoned.update(_names(t))  # ways[i] = ... in a loop changes ways
            if isinstance(n, ast.Call) and folder.dotted(n.func) not in _PURE and \
                    not folder.dotted(n.func).startswith("math."):
                poisoned.update(a.id for a in n.args if isinstance(a, ast.Name))  # f(xs) may change xs
            if isinstance(n, (ast.NamedExpr, ast.Global, ast.Nonlocal)):
                poisoned.update(_names(n.target) if isinstance(n, ast.NamedExpr) else n.names)
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                poisoned.update((a.asname or a.name).split(".")[0] for a in n.names)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                poisoned.add(n.name)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
                poisoned.add(n.func.value.id)  # xs.append(...) changes xs
    return _Straight(tree, folder, poisoned)


# ------------------------------------------------------------------------------------------------- verdicts

def python_call(prior: list[str], code: str, answer: Answer) -> str | None:
    """Why this python call's output does not count as the tool computing the answer, or None when it counts."""
    earlier = _combined(prior)
    first = len(earlier.body) if earlier is not None else 0
    tree = _combined([*prior, code])
    if tree is None or len(tree.body) == first:
        return "its code does not parse"
    c = _Code(tree, first, answer)
    outs = c.outputs()
    if not answer.given:
        for node in outs:
            for v in c.carriers(node):
                if answer.shows(v):
                    return (f"the call shows the answer through a constant it chose "
                            f"({_show(v)} in `{_src(node)}`), not a computation over the problem's quantities")
    data = [i for i, node in enumerate(outs) if c.is_data(node)]
    if not data:
        return "none of the call's outputs depends on the problem's quantities"
    worlds = [c.folded_outputs(w) for w in moved_worlds(c.tree, answer.quantities)]
    for i in data:
        vals = [w[i] for w in worlds]
        if any(v is UNKNOWN or isinstance(v, Hole) for v in vals):
            return None  # a computation the folder cannot follow: it may be where the answer comes from
        if answer.shows(vals[0]) and not all(answer.shows(v) for v in vals[1:]):
            return None
    if any(answer.shows(w[i]) for w in worlds for i in data):
        return "its output shows the answer whatever the problem's quantities (a constant in disguise)"
    return ("every output that depends on the problem's quantities computes something else; the answer comes "
            "from elsewhere in the call")


def other_call(args: dict[str, Any], answer: Answer) -> str | None:
    """Why a call of another tool (a shell command, a calculator's expression) only shows a literal, or None."""
    if answer.given:
        return None
    for key, val in args.items():
        if not isinstance(val, str):
            continue
        if any(answer.same(x) for x in numbers_in(val)):
            return f"its argument {key!r} shows the answer as written"
        for expr in _arith_pieces(val):
            if not is_quantity(expr, answer.quantities) and answer.shows(fold_expr(expr)):
                return f"its argument {key!r} computes the answer from constants alone ({expr.strip()!r})"
    return None


_SHELL_ARITH = re.compile(r"\$\(\((.*?)\)\)|\bexpr\s+([^;|&\n]+)|\becho\s+['\"]?([-+*/%() \d.]+)['\"]?\s*\|\s*bc")


def _arith_pieces(text: str) -> list[str]:
    """The argument as a Python expression (a calculator's), and the arithmetic a shell command does: $((...)),
    `expr A + B`, `echo A+B | bc`."""
    pieces = [text]
    for m in _SHELL_ARITH.finditer(text[:MAX_LEN]):
        piece = next(g for g in m.groups() if g is not None)
        pieces.append(piece.replace("\\*", "*") if m.group(2) else piece)
    return pieces


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _src(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, RecursionError, AttributeError):
        return "?"
    return text if len(text) <= 80 else text[:77] + "..."
