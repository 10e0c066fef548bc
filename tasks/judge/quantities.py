"""The prompt's quantities and the answer in numeric code, for provenance (tasks/judge/provenance.py): the
numbers a text shows, the rewarded Answer, whether a value is one of the prompt's quantities, the NumericFolder
(the forensics folder plus what numeric code uses: range, round, small math functions, eval of a readable
string), and the worlds in which one written quantity moves (`Shift`, `moved_worlds`), which tell a constant in disguise
from data. Runs no code and judges nothing.
"""

from __future__ import annotations

import ast
import copy
import math
import re
from dataclasses import dataclass
from typing import Any

from tasks import pyast
from tasks.judge.constfold import MAX_LEN, UNKNOWN, Folder, Hole, is_known

NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def numbers_in(text: str) -> list[float]:
    """Every number a text shows: 1,234 both as 1234 and as 1 and 234; 178.0 and 1.78e2 as floats."""
    out = []
    for m in NUMBER_RE.finditer(text):
        tok = m.group()
        cands = [p for p in tok.split(",") if p and p != "-"]
        if "," in tok and re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:[eE][-+]?\d+)?", tok):
            cands.append(tok.replace(",", ""))
        for c in cands:
            try:
                out.append(float(c))
            except ValueError:
                continue
    return out


@dataclass(frozen=True)
class Answer:
    """The rewarded answer, the task's tolerance and the prompt's quantities."""

    value: float
    tolerance: float
    quantities: frozenset[float]

    def same(self, x: float) -> bool:
        return math.isfinite(x) and abs(x - self.value) <= self.tolerance * max(1.0, abs(self.value))

    @property
    def given(self) -> bool:
        """The prompt itself gives the answer's number (then printing it as written is not a literal answer)."""
        return any(self.same(q) for q in self.quantities)

    def shows(self, v: Any) -> bool:
        """A folded value whose text (str of a number, the text of a string, the repr of a container) shows it."""
        if v is UNKNOWN or v is None:
            return False
        if isinstance(v, bool):
            return False
        if isinstance(v, (int, float)):
            return self.same(float(v))
        if isinstance(v, (bytes, bytearray)):
            v = bytes(v).decode("latin-1")
        try:
            text = v if isinstance(v, str) else repr(v)
        except (ValueError, RecursionError):
            return False
        return any(self.same(x) for x in numbers_in(text[:MAX_LEN]))


def is_quantity(value: Any, quantities: frozenset[float]) -> bool:
    """A number the prompt gives, or a string that shows one (the prompt's text pasted into the code)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return abs(float(value)) in quantities
    if isinstance(value, str):
        return any(abs(x) in quantities for x in numbers_in(value[:MAX_LEN]))
    return False


# ------------------------------------------------------------------------------------------------ folding

_MATH = {"factorial": (math.factorial, 2000), "comb": (math.comb, 10_000), "perm": (math.perm, 10_000),
         "gcd": (math.gcd, None), "lcm": (math.lcm, None), "isqrt": (math.isqrt, None), "sqrt": (math.sqrt, None),
         "floor": (math.floor, None), "ceil": (math.ceil, None), "prod": (math.prod, None),
         "trunc": (math.trunc, None), "fabs": (math.fabs, None), "log10": (math.log10, None),
         "log2": (math.log2, None), "exp": (math.exp, 700)}


class NumericFolder(Folder):
    """The forensics folder, plus what numeric code uses: range, round, divmod, pow, small math functions, and
    eval() of a string it can read."""

    def _call(self, node: ast.Call) -> Any:
        name = self.dotted(node.func)
        short = name.rsplit(".", 1)[-1]
        if name in ("range", "round", "divmod", "pow", "eval") or (name.startswith("math.") and short in _MATH):
            args = [self.fold(a) for a in node.args]
            if node.keywords or not is_known(*args):
                return UNKNOWN
            if name == "eval":
                return self._eval(args)
            if any(isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a) > 10**12 for a in args) and \
                    name != "round":
                return UNKNOWN
            if name == "range":
                r = range(*args)
                return list(r) if len(r) <= MAX_LEN // 8 else UNKNOWN
            if name == "pow" and len(args) >= 2 and isinstance(args[1], int) and abs(args[1]) > 256:
                return UNKNOWN
            if name.startswith("math."):
                fn, cap = _MATH[short]
                if cap is not None and any(isinstance(a, (int, float)) and a > cap for a in args):
                    return UNKNOWN
                return fn(*args)
            return {"round": round, "divmod": divmod, "pow": pow}[name](*args)
        return super()._call(node)

    def _comprehension(self, node: ast.ListComp | ast.GeneratorExp | ast.SetComp) -> Any:
        """As the base folder, but a filter it cannot evaluate makes the whole comprehension unknown (the base
        keeps every element then, which is right for finding strings and wrong for a count)."""
        gen = node.generators[0] if len(node.generators) == 1 else None
        if gen is not None and gen.ifs and isinstance(gen.target, ast.Name):
            it = self.fold(gen.iter)
            if is_known(it) and not isinstance(it, (int, float)):
                name, saved = gen.target.id, self.env.get(gen.target.id, UNKNOWN)
                try:
                    for x in list(it)[:MAX_LEN]:
                        self.env[name] = x
                        if any(not is_known(self.fold(c)) for c in gen.ifs):
                            return UNKNOWN
                finally:
                    self.env[name] = saved
        return super()._comprehension(node)

    def _eval(self, args: list[Any]) -> Any:
        if len(args) != 1 or not isinstance(args[0], str) or isinstance(args[0], Hole) or self._depth > 20:
            return UNKNOWN
        try:
            tree = pyast.parse(args[0].strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return UNKNOWN
        return self.fold(tree.body)  # type: ignore[attr-defined]


def fold_expr(text: str) -> Any:
    """The value a Python expression folds to with nothing bound, else UNKNOWN."""
    return NumericFolder()._eval([text])


MAX_MOVED = 8  # quantities moved one at a time (two worlds each) when testing for a constant in disguise


class Shift(ast.NodeTransformer):
    """Moves one written quantity (the k-th constant that is one: a number, or a string showing one): 'add' a
    small step, 'scale' by 1000. One occurrence at a time, so that h * 60 // lcm(a, b) + 1, whose value a joint
    move may keep, and 71 - 71, change in some world, while a * 0 + 636 shows 636 in every one."""

    def __init__(self, world: tuple[str, int], quantities: frozenset[float]):
        self.mode, self.target = world
        self.quantities = quantities
        self.seen = -1

    def _move(self, x: float) -> float:
        return x * 1000 + 3 if self.mode == "scale" else x + 7 + abs(x) % 13

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        v = node.value
        if isinstance(v, bool) or not is_quantity(v, self.quantities):
            return node
        self.seen += 1
        if self.seen != self.target:
            return node
        if isinstance(v, (int, float)):
            moved = self._move(float(v))
            return ast.copy_location(ast.Constant(int(moved) if isinstance(v, int) else moved), node)
        if isinstance(v, str) and len(v) <= MAX_LEN:
            def sub(m: re.Match[str]) -> str:
                try:
                    x = float(m.group())
                except ValueError:
                    return m.group()
                if abs(x) not in self.quantities:
                    return m.group()
                moved = self._move(x)
                return str(int(moved)) if moved == int(moved) and "." not in m.group() else str(moved)
            return ast.copy_location(ast.Constant(NUMBER_RE.sub(sub, v)), node)
        return node


def shifted(tree: ast.Module, world: tuple[str, int], quantities: frozenset[float]) -> ast.Module:
    return Shift(world, quantities).visit(copy.deepcopy(tree))


def moved_worlds(tree: ast.Module, quantities: frozenset[float]) -> list[tuple[str, int] | None]:
    """None (as given), then each written quantity (in Shift's visiting order), moved alone two ways."""
    n = sum(1 for x in ast.walk(copy.deepcopy(tree)) if isinstance(x, ast.Constant)
            and not isinstance(x.value, bool) and is_quantity(x.value, quantities))
    return [None] + [(mode, k) for k in range(min(n, MAX_MOVED)) for mode in ("add", "scale")]
