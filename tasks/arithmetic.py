"""Built-in procedural suite `arithmetic`: short word problems that need the python tool.

Deterministic from a seed. Train and held-out splits never share a problem: a problem's split is fixed by a hash
of its expression (whatever the wording or difficulty), and generation samples until the asked split is filled. Difficulty 1 adds or subtracts two 2-digit
numbers, 2 multiplies or chains three operands, 3 uses 3-digit operands and mixed operations.
The reference solution prints the expression with the python tool, then answers 'Answer: N'.
"""

from __future__ import annotations

import hashlib
import random

from tasks.spec import ReferenceSolution, Task, ToolCallStep, VerifierSpec

SUITE = "arithmetic"
VERSION = "1"

_TEMPLATES: dict[str, list[str]] = {
    "+": ["{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?",
          "What is {a} + {b}?"],
    "-": ["{name} has {a} {thing} and gives away {b}. How many {thing} are left?",
          "What is {a} - {b}?"],
    "*": ["{name} buys {a} boxes with {b} {thing} each. How many {thing} is that?",
          "What is {a} * {b}?"],
}
_NAMES = ["Ana", "Ben", "Kim", "Raj", "Zoe", "Leo", "Mia", "Sam"]
_THINGS = ["apples", "coins", "books", "cards", "pens", "stones"]


def _split_of(key: str) -> str:
    return "heldout" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0 else "train"


def _problem(rng: random.Random, difficulty: int) -> tuple[str, str, int]:
    """(prompt, python expression, answer)"""
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    if difficulty <= 1:
        op = rng.choice("+-")
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if op == "-" and b > a:
            a, b = b, a
    elif difficulty == 2:
        op = rng.choice("+-*")
        a = rng.randint(10, 99)
        b = rng.randint(2, 9) if op == "*" else rng.randint(10, 99)
        if op == "-" and b > a:
            a, b = b, a
    else:
        op = rng.choice("+-*")
        a = rng.randint(100, 999)
        b = rng.randint(10, 99) if op == "*" else rng.randint(100, 999)
        if op == "-" and b > a:
            a, b = b, a
    prompt = rng.choice(_TEMPLATES[op]).format(name=name, thing=thing, a=a, b=b)
    expr = f"{a} {op} {b}"
    return prompt, expr, eval(expr)  # noqa: S307 - our own two-integer expression


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
            raise ValueError(f"cannot draw {n} distinct {split} tasks at difficulty {difficulty}; ask for fewer")
        prompt, expr, answer = _problem(rng, difficulty)
        # The split hangs on the arithmetic alone (not the wording, name or difficulty), so the same sum can never
        # be train under one template and held-out under another.
        if prompt in seen or _split_of(expr) != split:
            continue
        seen.add(prompt)
        tid = f"{SUITE}-d{difficulty}-" + hashlib.sha256(prompt.encode()).hexdigest()[:10]
        tasks.append(Task(
            id=tid, suite=SUITE, version=VERSION, split=split, prompt=prompt, tools=["python"],
            verifier=VerifierSpec(kind="numeric", answer=str(answer), requires_tool="python"),
            reference=ReferenceSolution(steps=[ToolCallStep(tool="python", arguments={"code": f"print({expr})"})],
                                        final=f"Answer: {answer}"),
            difficulty=difficulty, metadata={"expression": expr},
        ))
    return tasks
