"""Built-in procedural suite `mathword`: multi-step math word problems solved with the python tool (ReTool-style).

Deterministic from a seed. Each problem family draws parameters, renders a short story, and carries the Python
program that solves it; the expected answer is that program's result computed here (exact integers, no floats).
Difficulty 1: one or two steps (series, small counts); 2: counting with conditions, digit sums, compound growth;
3: dynamic programming and prime counting over larger ranges. A problem's split is fixed by a hash of its text.
The reference solution runs the program with the python tool, then answers 'Answer: N'.
This module does not run code in a sandbox or verify.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.spec import ReferenceSolution, Task, ToolCallStep, VerifierSpec

SUITE = "mathword"
VERSION = "1"
_NAMES = ["Ana", "Ben", "Kim", "Raj", "Zoe", "Leo", "Mia", "Sam"]


@dataclass(frozen=True)
class Family:
    name: str
    levels: tuple[int, ...]
    params: Callable[[random.Random, int], dict[str, Any]]
    text: str
    code: str  # prints the answer; formatted with params


def _p_savings(r: random.Random, d: int) -> dict[str, Any]:
    return {"s": r.randint(2, 20), "inc": r.randint(1, 9), "w": r.randint(5, 12 * d)}


def _p_committee(r: random.Random, d: int) -> dict[str, Any]:
    n = r.randint(6, 10 + 5 * d)
    return {"n": n, "k": r.randint(2, min(5, n - 1))}


def _p_buses(r: random.Random, d: int) -> dict[str, Any]:
    return {"a": r.randint(4, 15), "b": r.randint(6, 25), "h": r.randint(2, 4 * d + 2)}


def _p_divisible(r: random.Random, d: int) -> dict[str, Any]:
    a, b = r.sample(range(2, 10), 2)
    return {"n": r.randint(100, 1000 * d), "a": a, "b": b, "c": r.choice([x for x in range(4, 16) if x not in (a, b)])}


def _p_digits(r: random.Random, d: int) -> dict[str, Any]:
    return {"a": r.randint(2, 9), "b": r.randint(10, 30 * d)}


def _p_interest(r: random.Random, d: int) -> dict[str, Any]:
    return {"p": r.randrange(1000, 20000, 100), "r": r.randint(2, 9), "n": r.randint(3, 5 * d)}


def _p_stairs(r: random.Random, d: int) -> dict[str, Any]:
    return {"n": r.randint(10, 30), "m": r.randint(2, 3)}


def _p_primes(r: random.Random, d: int) -> dict[str, Any]:
    a = r.randint(10, 2000)
    return {"a": a, "b": a + r.randint(100, 3000)}


FAMILIES: list[Family] = [
    Family("savings", (1, 2), _p_savings,
           "{name} saves ${s} in week 1 and ${inc} more each week than the week before. "
           "How many dollars has {name} saved after {w} weeks?",
           "print(sum({s} + {inc} * i for i in range({w})))"),
    Family("committee", (1, 2), _p_committee,
           "A club of {n} people picks a committee of {k}. How many different committees are possible?",
           "import math\nprint(math.comb({n}, {k}))"),
    Family("buses", (1, 2), _p_buses,
           "Bus A leaves every {a} minutes and bus B every {b} minutes; both leave at 6:00. How many times do "
           "they leave together from 6:00 to {h} hours later, both ends included?",
           "import math\nprint({h} * 60 // math.lcm({a}, {b}) + 1)"),
    Family("divisible", (2, 3), _p_divisible,
           "How many integers from 1 to {n} are divisible by {a} or by {b}, but not by {c}?",
           "print(sum(1 for k in range(1, {n} + 1) if (k % {a} == 0 or k % {b} == 0) and k % {c} != 0))"),
    Family("digits", (2, 3), _p_digits,
           "What is the sum of the decimal digits of {a} to the power {b}?",
           "print(sum(int(c) for c in str({a} ** {b})))"),
    Family("interest", (2, 3), _p_interest,
           "{name} deposits ${p} at {r}% yearly interest, compounded once a year. How many whole dollars are "
           "in the account after {n} years (round down)?",
           "from fractions import Fraction\nprint(int(Fraction({p}) * Fraction(100 + {r}, 100) ** {n}))"),
    Family("stairs", (3,), _p_stairs,
           "{name} climbs a staircase of {n} steps, taking between 1 and {m} steps at a time. In how many "
           "different ways can {name} reach the top?",
           "ways = [1] + [0] * {n}\nfor i in range(1, {n} + 1):\n"
           "    ways[i] = sum(ways[i - j] for j in range(1, {m} + 1) "
           "if i - j >= 0)\nprint(ways[{n}])"),
    Family("primes", (3,), _p_primes,
           "How many prime numbers are there between {a} and {b}, both included?",
           "print(sum(1 for k in range({a}, {b} + 1) if k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))))"),
]


def _split_of(key: str) -> str:
    return "heldout" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0 else "train"


def _run(code: str) -> int:
    """The reference program's printed answer. Its print writes to a buffer of its own: redirecting sys.stdout is
    process-wide, so under a flow's threads (Prefect's print capture) the answer went to the log instead."""
    import io

    buf = io.StringIO()

    def _print(*args: Any, **kwargs: Any) -> None:
        kwargs.pop("file", None)
        print(*args, file=buf, **kwargs)

    exec(code, {"math": math, "print": _print})  # noqa: S102 - our own reference program
    return int(buf.getvalue().strip())


def generate(n: int, *, split: str = "train", seed: int = 0, difficulty: int = 1) -> list[Task]:
    """n distinct tasks of the given split and difficulty, the same for the same arguments."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    if difficulty not in (1, 2, 3):
        raise ValueError(f"difficulty must be 1, 2 or 3, not {difficulty!r}")
    fams = [f for f in FAMILIES if difficulty in f.levels]
    rng = random.Random(f"{SUITE}-{seed}-{difficulty}")
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * (n + 10):
            raise ValueError(f"cannot draw {n} distinct {split} mathword tasks at difficulty {difficulty}; "
                             "ask for fewer")
        fam = rng.choice(fams)
        p = fam.params(rng, difficulty) | {"name": rng.choice(_NAMES)}
        prompt = fam.text.format(**p)
        if prompt in seen or _split_of(f"{difficulty}:{prompt}") != split:
            continue
        seen.add(prompt)
        code = fam.code.format(**p)
        answer = _run(code)
        tid = f"{SUITE}-d{difficulty}-" + hashlib.sha256(prompt.encode()).hexdigest()[:10]
        tasks.append(Task(
            id=tid, suite=SUITE, version=VERSION, split=split, prompt=prompt, tools=["python"],
            verifier=VerifierSpec(kind="numeric", answer=str(answer), requires_tool="python"),
            reference=ReferenceSolution(steps=[ToolCallStep(tool="python", arguments={"code": code})],
                                        final=f"Answer: {answer}"),
            difficulty=difficulty, metadata={"family": fam.name, "params": p},
        ))
    return tasks
