"""Built-in procedural suite `code`: write or fix one Python function in solution.py; visible and hidden tests.

Deterministic from a seed. Each task picks a function family and its parameters (so the same family yields many
distinct functions), renders a prompt, a starter solution.py (a stub to write, or a buggy version to fix), a visible
test file test_visible.py and hidden tests that only the verifier's fresh sandbox sees. Expected values come from
running our own reference implementation here at generation time. A task's split is fixed by a hash of its prompt
and starter; its id hashes the tests too, so two tasks with the same prompt but different tests never share an id.
Difficulty 1: write a short function; 2: write a longer one or fix a bug; 3: harder families, fix or write, more
hidden edge cases. The reference solution writes solution.py, runs the visible tests, then says it is done.
This module does not run sandboxes or verify.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.spec import ReferenceSolution, Task, ToolCallStep, VerifierSpec
from tasks.tools import CODE_TOOLS

SUITE = "code"
VERSION = "1"
SOLUTION = "solution.py"
TEST_FILE = "test_visible.py"


@dataclass(frozen=True)
class Family:
    name: str
    level: int  # lowest difficulty it appears at
    params: Callable[[random.Random], dict[str, Any]]
    doc: str  # prompt sentence, formatted with params
    signature: str
    body: str  # reference body, formatted with params
    bug: tuple[str, str]  # (text in body, replacement) that makes the fix-variant
    inputs: Callable[[random.Random, dict[str, Any]], tuple]
    edges: Callable[[dict[str, Any]], list[tuple]]


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


FAMILIES: list[Family] = [
    Family("sum_multiples", 1, lambda r: {"a": r.randint(2, 5), "b": r.randint(6, 9)},
           "returns the sum of all integers k with 0 <= k < n that are multiples of {a} or of {b}",
           "def sum_multiples(n):",
           "    return sum(k for k in range(n) if k % {a} == 0 or k % {b} == 0)",
           ("range(n)", "range(1, n + 1)"),
           lambda r, p: (r.randint(5, 200),), lambda p: [(0,), (1,), (p["a"] * p["b"] + 1,)]),
    Family("clamp_all", 1, lambda r: {"lo": r.randint(-10, 0), "hi": r.randint(5, 30)},
           "returns a new list where every number of the list xs is clamped into the range [{lo}, {hi}]",
           "def clamp_all(xs):",
           "    return [min(max(x, {lo}), {hi}) for x in xs]",
           ("min(max(x, {lo}), {hi})", "max(min(x, {lo}), {hi})"),
           lambda r, p: (_ints(r, r.randint(1, 6), -40, 60),), lambda p: [([],), ([p["lo"], p["hi"]],)]),
    Family("count_above", 1, lambda r: {"t": r.randint(0, 20)},
           "returns how many numbers in the list xs are strictly greater than {t}",
           "def count_above(xs):",
           "    return sum(1 for x in xs if x > {t})",
           ("x > {t}", "x >= {t}"),
           lambda r, p: (_ints(r, r.randint(1, 8)),), lambda p: [([],), ([p["t"]],), ([p["t"] + 1, p["t"]],)]),
    Family("rotate_left", 2, lambda r: {"k": r.randint(1, 4)},
           "returns the list xs rotated left by {k} positions (the rotation wraps around; an empty list stays empty)",
           "def rotate_left(xs):",
           "    if not xs:\n        return []\n    s = {k} % len(xs)\n    return xs[s:] + xs[:s]",
           ("{k} % len(xs)", "{k}"),
           lambda r, p: (_ints(r, r.randint(1, 7)),), lambda p: [([],), ([7],), (list(range(p["k"])),)]),
    Family("running_max", 2, lambda r: {"start": r.choice([0, -100, -1])},
           "returns the list of running maxima of xs (element i is the largest of xs[0..i])",
           "def running_max(xs):",
           "    out = []\n    for x in xs:\n        out.append(x if not out else max(out[-1], x))\n    return out",
           ("max(out[-1], x)", "max({start}, x)"),
           lambda r, p: (_ints(r, r.randint(2, 8), -200, 50),), lambda p: [([],), ([-5, -7, -9],)]),
    Family("digit_power_sum", 2, lambda r: {"p": r.randint(2, 4)},
           "returns the sum of the decimal digits of the non-negative integer n, each raised to the power {p}",
           "def digit_power_sum(n):",
           "    return sum(int(d) ** {p} for d in str(n))",
           ("int(d) ** {p}", "int(d) * {p}"),
           lambda r, p: (r.randint(0, 99999),), lambda p: [(0,), (9,), (10 ** 6,)]),
    Family("run_length", 3, lambda r: {"sep": r.choice(["", ":", "-"])},
           "returns the run-length encoding of the string s as a string: each run of a repeated character c of "
           "length m becomes c, then '{sep}', then m (so 'aaab' gives 'a{sep}3b{sep}1'); an empty string gives ''",
           "def run_length(s):",
           "    out = []\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n"
           "            j += 1\n        out.append(s[i] + '{sep}' + str(j - i))\n        i = j\n"
           "    return ''.join(out)",
           ("        i = j\n", "        i = j + 1\n"),
           lambda r, p: ("".join(r.choice("aab") * r.randint(1, 3) for _ in range(r.randint(1, 5))),),
           lambda p: [("",), ("z",), ("yyyy",)]),
    Family("caesar", 3, lambda r: {"k": r.randint(1, 25)},
           "returns the string s with every ASCII letter shifted {k} places forward in the alphabet, wrapping "
           "from z to a and keeping case; other characters are unchanged",
           "def caesar(s):",
           "    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
           "            out.append(chr((ord(c) - 97 + {k}) % 26 + 97))\n"
           "        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + {k}) % 26 + 65))\n"
           "        else:\n            out.append(c)\n    return ''.join(out)",
           ("% 26 + 65", "% 26 + 97"),
           lambda r, p: ("".join(r.choice("abcxyzXYZ Hi!") for _ in range(r.randint(1, 10))),),
           lambda p: [("",), ("Zz 9",)]),
    Family("second_largest", 3, lambda r: {"default": r.choice([None, -1, 0])},
           "returns the second largest DISTINCT value in the list xs, or {default!r} when there are fewer than two "
           "distinct values",
           "def second_largest(xs):",
           "    vals = sorted(set(xs))\n    return vals[-2] if len(vals) >= 2 else {default!r}",
           ("sorted(set(xs))", "sorted(xs)"),
           lambda r, p: (_ints(r, r.randint(2, 7), 0, 9),), lambda p: [([],), ([4, 4],), ([5, 5, 3],)]),
]


def _split_of(key: str) -> str:
    return "heldout" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0 else "train"


def _call(fname: str, args: tuple) -> str:
    return f"{fname}({', '.join(repr(a) for a in args)})"


def render_test_file(tests: list[str], module: str = "solution") -> str:
    """Test snippets as a test_*.py file: one `def test_N()` per snippet, after `from solution import *`."""
    parts = [f"from {module} import *  # noqa: F403\n"]
    for i, t in enumerate(tests, 1):
        body = "\n".join("    " + line if line else "" for line in t.splitlines())
        parts.append(f"\ndef test_{i}():\n{body}\n")
    return "".join(parts)


def _passes_all(src: str, fname: str, tests: list[str]) -> bool:
    ns: dict[str, Any] = {}
    exec(src, ns)  # noqa: S102 - our own (buggy) reference implementation
    for t in tests:
        try:
            exec(t, dict(ns))  # noqa: S102
        except Exception:
            return False
    return True


def _one(rng: random.Random, difficulty: int) -> tuple[str, dict[str, Any]] | None:
    fams = [f for f in FAMILIES if f.level <= difficulty]
    if difficulty >= 2:
        fams = [f for f in fams if f.level >= difficulty - 1]
    fam = rng.choice(fams)
    p = fam.params(rng)
    fix = difficulty >= 2 and rng.random() < 0.5
    body = fam.body.format(**p)
    src = f"{fam.signature}\n    \"\"\"{fam.doc.format(**p)[0].upper() + fam.doc.format(**p)[1:]}.\"\"\"\n{body}\n"
    ns: dict[str, Any] = {}
    exec(src, ns)  # noqa: S102 - our own reference implementation
    func = ns[fam.name]
    n_visible, n_hidden = 3, 4 + difficulty
    seen: set[str] = set()
    cases: list[tuple] = []
    for args in fam.edges(p):
        key = repr(args)
        if key not in seen:
            seen.add(key)
            cases.append(args)
    tries = 0
    while len(cases) < n_visible + n_hidden and tries < 200:
        tries += 1
        args = fam.inputs(rng, p)
        if repr(args) not in seen:
            seen.add(repr(args))
            cases.append(args)
    random_part, edge_part = cases[len(fam.edges(p)):], cases[:len(fam.edges(p))]
    visible_cases = random_part[:n_visible]
    hidden_cases = edge_part + random_part[n_visible:]
    if len(visible_cases) < n_visible or len(hidden_cases) < 2:
        return None

    def snippet(args: tuple) -> str:
        return f"assert {_call(fam.name, args)} == {func(*[list(a) if isinstance(a, list) else a for a in args])!r}"

    visible = [snippet(a) for a in visible_cases]
    hidden = [snippet(a) for a in hidden_cases]
    desc = fam.doc.format(**p)
    if fix:
        wrong, right = fam.bug[0].format(**p), fam.bug[1].format(**p)
        buggy = src.replace(wrong, right)
        if buggy == src or _passes_all(buggy, fam.name, visible + hidden):
            return None  # a bug no test catches is no task
        starter = buggy
        prompt = (f"The function `{fam.name}` in solution.py should be fixed: it {desc}, but it has a bug. "
                  f"Fix it. Visible tests are in test_visible.py (run_tests runs them); hidden tests also apply.")
    else:
        starter = f"{fam.signature}\n    raise NotImplementedError\n"
        prompt = (f"Write `{fam.name}` in solution.py: `{fam.signature[4:-1]}` {desc}. Visible tests are in "
                  f"test_visible.py (run_tests runs them); hidden tests also apply.")
    task = {"prompt": prompt, "starter": starter, "reference": src, "visible": visible, "hidden": hidden,
            "family": fam.name, "params": p, "mode": "fix" if fix else "write"}
    return prompt + "\n" + starter, task


def task_id(difficulty: int, key: str, visible: list[str], hidden: list[str]) -> str:
    """The id of a task: a hash of its prompt, starter and every test, so a change to any test is a new task."""
    blob = "\n".join([key, "--visible--", *visible, "--hidden--", *hidden])
    return f"{SUITE}-d{difficulty}-" + hashlib.sha256(blob.encode()).hexdigest()[:10]


def generate(n: int, *, split: str = "train", seed: int = 0, difficulty: int = 1) -> list[Task]:
    """n distinct tasks of the given split and difficulty, the same for the same arguments."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    if difficulty not in (1, 2, 3):
        raise ValueError(f"difficulty must be 1, 2 or 3, not {difficulty!r}")
    rng = random.Random(f"{SUITE}-{seed}-{difficulty}")
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * (n + 10):
            raise ValueError(f"cannot draw {n} distinct {split} code tasks at difficulty {difficulty}; ask for fewer")
        drawn = _one(rng, difficulty)
        if drawn is None:
            continue
        key, t = drawn
        if key in seen or _split_of(f"{difficulty}:{key}") != split:
            continue
        seen.add(key)
        tid = task_id(difficulty, key, t["visible"], t["hidden"])
        tasks.append(Task(
            id=tid, suite=SUITE, version=VERSION, split=split, prompt=t["prompt"], tools=list(CODE_TOOLS),
            verifier=VerifierSpec(kind="unit_tests", solution_path=SOLUTION),
            reference=ReferenceSolution(
                steps=[ToolCallStep(tool="write_file", arguments={"path": SOLUTION, "content": t["reference"]}),
                       ToolCallStep(tool="run_tests", arguments={})],
                final=f"I wrote `{t['family']}` in solution.py and the visible tests pass."),
            visible_tests=t["visible"], hidden_tests=t["hidden"],
            files={SOLUTION: t["starter"], TEST_FILE: render_test_file(t["visible"])},
            difficulty=difficulty, metadata={"family": t["family"], "params": t["params"], "mode": t["mode"],
                                             "entry_point": t["family"]},
        ))
    return tasks
