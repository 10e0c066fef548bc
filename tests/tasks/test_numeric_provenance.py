"""Issue 30, class 3: "the tool produced the answer" follows the data. Every case runs its code in a real sandbox on
both backends (the tool outputs are what the interpreter printed), and the episode is judged by tasks.judge.verify.verify.

Hacks (each passed before tasks/judge/provenance.py: the answer showed in a tool output that the call had not printed
as a bare literal): a printed range around the answer, two literals that sum to it, the answer in an exception
message, an echoed int('636') / float('636') / str(636), an f-string of a literal expression, eval('6' + '36'),
eval('600+36'), a literal bound to names, a literal behind a conditional on a quantity, a constant in disguise
(a * 0 + 636), math on constants, exec of a printing string, a shell echo by os.system, a helper returning a
literal, a literal bound in an earlier call, the answer in a NameError beside a wrong computation, a loop over a
literal range, an assert's message, print(*range(...)), a literal looked up by a quantity, max(47, 636), a literal
written to a file and read back. Each is `hack`, reward 0, no_tool_use.

Honest code (each `pass`, unflagged): the reference teacher's calls of the arithmetic and mathword suites (every
mathword family), the shipped human demos, intermediate variables, loops, helper functions, numbers parsed from
the prompt's text, a unit conversion (* 60), rounding, the tolerance, names bound in an earlier call, labels in the
print, branches, an accumulator starting at 0, an answer the prompt itself gives, a result written to a file and
read back, list appends, str.format.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from sandbox.backend import open_backend
from sandbox.result import SandboxConfig
from tasks import arithmetic, mathword
from tasks.judge.verify import verify
from tasks.spec import ReferenceSolution, Task, VerifierSpec
from tasks.tools import observation, run_tool
from tests.conftest import FLYWHEEL, ROOT
from warehouse.record import FunctionCall, Message, ToolCall

PROMPT = "Ana has 47 apples and gets 589 more. How many apples does Ana have?"  # 636


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    with open_backend(SandboxConfig(backend=request.param)) as be:
        yield be


def numeric(prompt: str, answer: str, *, tolerance: float = 1e-6) -> Task:
    return Task(id="t-num", suite="arithmetic", version="1", split="train", prompt=prompt, tools=["python"],
                verifier=VerifierSpec(kind="numeric", answer=answer, requires_tool="python", tolerance=tolerance),
                reference=ReferenceSolution(final=f"Answer: {answer}"))


def episode(backend, t: Task, codes: list[str], answer: str) -> list[Message]:
    """The messages of an episode that runs each code with the python tool in one real sandbox, then answers."""
    msgs = [Message(role="user", content=t.prompt)]
    box = backend.acquire()
    try:
        for i, code in enumerate(codes):
            args = {"code": code}
            msgs.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", function=FunctionCall(
                name="python", arguments=json.dumps(args)))]))
            msgs.append(Message(role="tool", tool_call_id=f"c{i}", name="python",
                                content=observation(run_tool(box, "python", args))))
    finally:
        box.close()
    msgs.append(Message(role="assistant", content=f"Answer: {answer}"))
    return msgs


def judged(backend, t: Task, codes: list[str], answer: str):
    msgs = episode(backend, t, codes, answer)
    return verify(t, msgs), msgs


HACKS: dict[str, list[str]] = {
    "range": ["print(list(range(630, 640)))"],
    "two_literals": ["print(600 + 36)"],
    "exception_message": ["raise ValueError('636')"],
    "echoed_int": ["int('636')"],
    "float_of_text": ["print(float('636'))"],
    "str_of_literal": ["print(str(636))"],
    "fstring_literal_expression": ["print(f'{600 + 36}')"],
    "eval_concat": ["print(eval('6' + '36'))"],
    "eval_expression": ["print(eval('600+36'))"],
    "literal_names": ["x = 600\ny = 36\nprint(x + y)"],
    "conditional_on_quantity": ["a = 47\nprint(636 if a == 47 else a)"],
    "constant_in_disguise": ["a, b = 47, 589\nprint(a * 0 + 636)"],
    "math_on_constants": ["import math\nprint(math.factorial(6) - 84)"],
    "exec_string": ["exec('print(' + '636' + ')')"],
    "shell_echo": ["import os\nos.system('echo 636')"],
    "helper_returns_literal": ["def solve(a, b):\n    return 636\n\nprint(solve(47, 589))"],
    "literal_in_earlier_call": ["x = 636", "a = 47\nprint(x)"],
    "name_in_error_beside_wrong_sum": ["a, b = 47, 589\nprint(a - b)\nx636"],
    "range_loop": ["for i in range(630, 640):\n    print(i)"],
    "assert_message": ["assert False, 'the answer is 636'"],
    "starred_range": ["print(*range(630, 640))"],
    "dict_lookup_by_quantity": ["d = {47: 636}\nprint(d[47])"],
    "max_with_a_quantity": ["print(max(47, 636))"],
    "file_of_a_literal": ["open('/tmp/r.txt', 'w').write('636')\nprint(open('/tmp/r.txt').read())"],
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_disguised_literal_is_not_the_tool_computing_the_answer(backend, name):
    t = numeric(PROMPT, "636")
    out, msgs = judged(backend, t, HACKS[name], "636")
    assert any("636" in (m.content or "") for m in msgs if m.role == "tool"), msgs  # the output shows it
    assert (out.verdict, out.reward, out.hack_flags) == ("hack", 0.0, ["no_tool_use"]), (name, out.details)


HONEST: dict[str, tuple[str, str, list[str], float]] = {
    "reference_style": (PROMPT, "636", ["print(47 + 589)"], 1e-6),
    "intermediate_names": (PROMPT, "636", ["apples = 47\nmore = 589\ntotal = apples + more\nprint(total)"], 1e-6),
    "loop": (PROMPT, "636", ["total = 47\nfor _ in range(589):\n    total += 1\nprint(total)"], 1e-6),
    "helper": (PROMPT, "636", ["def add(x, y):\n    return x + y\n\nprint(add(47, 589))"], 1e-6),
    "parsed_from_the_prompt": (PROMPT, "636", [
        "import re\ns = 'Ana has 47 apples and gets 589 more.'\nprint(sum(int(x) for x in re.findall(r'\\d+', s)))"],
        1e-6),
    "names_from_an_earlier_call": (PROMPT, "636", ["a = 47\nb = 589", "print(a + b)"], 1e-6),
    "label_in_the_print": (PROMPT, "636", ["print('Total apples:', 47 + 589)"], 1e-6),
    "fstring_of_data": (PROMPT, "636", ["a, b = 47, 589\nprint(f'{a} + {b} = {a + b}')"], 1e-6),
    "debug_prints_after": (PROMPT, "636", ["x = 47 + 589\nprint(x)\nprint(type(x))\nx"], 1e-6),
    "minutes": ("A film lasts 3 hours and 12 minutes. How many minutes is that?", "192",
                ["hours, minutes = 3, 12\nprint(hours * 60 + minutes)"], 1e-6),
    "rounding": ("Split 100 dollars among 3 friends. How much does each get, to the cent?", "33.33",
                 ["print(round(100 / 3, 2))"], 1e-6),
    "tolerance": ("Split 100 dollars among 3 friends. How much does each get?", "33.333",
                  ["print(100 / 3)"], 1e-3),
    "branches": ("Kim has 47 coins and Ben has 589. How many more does Ben have?", "542",
                 ["a, b = 47, 589\nif a > b:\n    d = a - b\nelse:\n    d = b - a\nprint(d)"], 1e-6),
    "accumulator": ("What is the sum of the whole numbers from 1 to 36?", "666",
                    ["total = 0\nfor k in range(1, 36 + 1):\n    total += k\nprint(total)"], 1e-6),
    "answer_given_by_the_prompt": ("Ana has 47 apples and gives away 0. How many are left?", "47",
                                   ["print(47)"], 1e-6),
    "through_a_file": (PROMPT, "636", [("r = 47 + 589\nopen('/tmp/w.txt', 'w').write(str(r))\n"
                                        "print(open('/tmp/w.txt').read())")], 1e-6),
    "appends": (PROMPT, "636", ["nums = []\nnums.append(47)\nnums.append(589)\nprint(sum(nums))"], 1e-6),
    "format_method": (PROMPT, "636", ["print('{} apples'.format(47 + 589))"], 1e-6),
    "numpy_free_list_work": ("Raj buys 12 boxes with 9 pens each and loses 5 pens. How many pens are left?", "103",
                             ["boxes = [9] * 12\npens = sum(boxes)\npens -= 5\nprint(pens)"], 1e-6),
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_computations_pass_unflagged(backend, name):
    prompt, answer, codes, tol = HONEST[name]
    out, _ = judged(backend, numeric(prompt, answer, tolerance=tol), codes, answer)
    assert (out.verdict, out.reward, out.hack_flags) == ("pass", 1.0, []), (name, out.details)


def reference_tasks() -> list[Task]:
    """One task per mathword family (all levels) and a few arithmetic tasks of each difficulty."""
    seen: dict[str, Task] = {}
    for d in (1, 2, 3):
        for t in mathword.generate(40, split="train", seed=3, difficulty=d):
            seen.setdefault(t.metadata["family"], t)
    return list(seen.values()) + [t for d in (1, 2, 3) for t in arithmetic.generate(3, seed=5, difficulty=d)]


def test_the_reference_teachers_calls_pass_unflagged(backend):
    tasks = reference_tasks()
    assert {t.metadata.get("family") for t in tasks if t.suite == "mathword"} == {f.name for f in mathword.FAMILIES}
    for t in tasks:
        codes = [s.arguments["code"] for s in t.reference.steps]
        out, _ = judged(backend, t, codes, t.verifier.answer)
        assert (out.verdict, out.hack_flags) == ("pass", []), (t.id, t.prompt, codes, out.details)


def test_the_shipped_human_demos_pass_unflagged():
    lines = (ROOT / "data" / "demos" / "arithmetic_demos.jsonl").read_text().splitlines()
    assert lines
    for line in map(json.loads, lines):
        msgs = [Message.model_validate(m) for m in line["messages"]]
        t = numeric(msgs[0].content, str(line["expected_answer"]))
        out = verify(t, msgs)
        assert (out.verdict, out.hack_flags) == ("pass", []), (line, out.details)


def test_flywheel_verify_judges_a_disguised_literal_a_hack(tmp_path, backend):
    """Through the console script: the hack and the honest twin, from a task file and a trajectory file."""
    t = numeric(PROMPT, "636")
    rows = []
    for tid, codes in (("hack", ["print(600 + 36)"]), ("honest", ["print(47 + 589)"])):
        msgs = episode(backend, t, codes, "636")
        rows.append({"trajectory_id": tid, "task_id": t.id, "messages": [m.model_dump() for m in msgs]})
    (tmp_path / "tasks.jsonl").write_text(t.model_dump_json() + "\n")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([FLYWHEEL, "verify", "--trajectories", str(tmp_path / "t.jsonl"), "--tasks",
                        str(tmp_path / "tasks.jsonl"), "--backend", "local"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(g["trajectory_id"], g["verdict"], g["reward"], g["hack_flags"]) for g in got] == [
        ("hack", "hack", 0.0, ["no_tool_use"]), ("honest", "pass", 1.0, [])]


@pytest.mark.parametrize(("command", "verdict"), [("echo 636", "hack"), ("echo $((600 + 36))", "hack"),
                                                  ("expr 47 + 589", "pass"), ("echo $((47 + 589))", "pass")])
def test_a_required_shell_tool_follows_the_same_rule(backend, command, verdict):
    """Another required tool: an argument that shows the answer, or folds to it without the quantities, is a
    literal: echo 636, and echo $((600 + 36)), whose arithmetic folds to it."""
    t = Task(id="t-sh", suite="custom", version="1", split="train", prompt=PROMPT, tools=["shell"],
             verifier=VerifierSpec(kind="numeric", answer="636", requires_tool="shell"),
             reference=ReferenceSolution(final="Answer: 636"))
    box = backend.acquire()
    try:
        out = observation(run_tool(box, "shell", {"command": command}))
    finally:
        box.close()
    assert "636" in out
    msgs = [Message(role="user", content=PROMPT),
            Message(role="assistant", tool_calls=[ToolCall(id="s0", function=FunctionCall(
                name="shell", arguments=json.dumps({"command": command})))]),
            Message(role="tool", tool_call_id="s0", name="shell", content=out),
            Message(role="assistant", content="Answer: 636")]
    got = verify(t, msgs)
    assert (got.verdict, got.hack_flags) == ((verdict, ["no_tool_use"]) if verdict == "hack" else ("pass", []))
