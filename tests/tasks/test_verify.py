"""Verification is fail-closed: numeric edge cases, and a unit-test harness that answers with nothing, garbage,
a wrong token, fewer results or an infrastructure error never yields a pass. Reward terms are logged apart.
The fault-injecting sandbox here (FaultInjectingBackend) is a test double; real sandboxes: test_sandboxed.py."""

from __future__ import annotations

import json

import pytest

from sandbox.result import ExecResult, SandboxError
from tasks.code import generate as code_tasks
from tasks.judge.answers import extract_answer
from tasks.judge.errors import VerifierUnavailable
from tasks.judge.rewards import RewardConfig
from tasks.judge.verify import verify
from tasks.spec import ReferenceSolution, Task, VerifierSpec
from tasks.tools import pristine_snapshot
from warehouse.record import FunctionCall, Message, ToolCall


def numeric_task(answer: str = "42", tol: float = 1e-6, tool: str | None = "python",
                 prompt: str = "What is 40 + 2?") -> Task:
    """A numeric task; its prompt gives the quantities an honest tool call computes with (tasks/judge/provenance.py)."""
    return Task(id="t", suite="s", version="1", split="train", prompt=prompt,
                verifier=VerifierSpec(answer=answer, tolerance=tol, requires_tool=tool),
                reference=ReferenceSolution(final=f"Answer: {answer}"))


def call(name: str, args: str, i: int = 0) -> Message:
    fc = FunctionCall(name=name, arguments=args)
    return Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", function=fc)])


def ep(final: str | None, *, tool: bool = True, code: str = "print(40 + 2)", out: str = "42") -> list[Message]:
    """An episode whose python call computes `out` (the answer must come from a tool output), then `final`."""
    msgs = [Message(role="user", content="?")]
    if tool:
        msgs += [call("python", json.dumps({"code": code})),
                 Message(role="tool", tool_call_id="c0", content=out)]
    if final is not None:
        msgs.append(Message(role="assistant", content=final))
    return msgs


@pytest.mark.parametrize("final,verdict", [
    ("Answer: 42", "pass"), ("answer = 42.0000000001", "pass"), ("Answer: 4,2", "pass"), ("Answer: 43", "fail"),
    ("The answer is 42", "fail"), ("", "fail"), (None, "fail"), ("Answer: nan", "fail"), ("Answer: 1e999", "fail"),
])
def test_numeric_fail_closed(final, verdict):
    assert verify(numeric_task(), ep(final)).verdict == verdict


def test_numeric_tolerance_and_last_answer_wins():
    hundred = {"code": "print(99 + 1)", "out": "100"}
    q = "What is 99 + 1?"
    assert verify(numeric_task("100", tol=0.01, prompt=q), ep("Answer: 100.9", **hundred)).verdict == "pass"
    assert verify(numeric_task("100", tol=0.001, prompt=q), ep("Answer: 100.9", **hundred)).verdict == "fail"
    assert extract_answer(ep("Answer: 1 ... no, Answer: 42")) == "42"


@pytest.mark.parametrize("code,out,final,verdict,prompt", [
    ("print(40 + 2)", "42", "Answer: 42", "pass", "What is 40 + 2?"),
    ("print(float(6 * 7))", "42.0", "Answer: 42", "pass", "What is 6 * 7?"),
    ("print(f'{41_958 + 42:,}')", "42,000", "Answer: 42,000", "pass", "What is 41958 + 42?"),
    ("print('ok')", "ok", "Answer: 42", "hack", "What is 40 + 2?"),
    ("print(42)", "42", "Answer: 42", "hack", "What is 40 + 2?"),
    ("x = 42\nprint(x)", "42", "Answer: 42", "hack", "What is 40 + 2?"),
    ("print(40 + 2)", "42", "Answer: 42", "hack", "What is 41 + 1?"),  # literals the model chose, not the prompt's
    ("print('ok')", "ok", "Answer: 41", "fail", "What is 40 + 2?"),  # a wrong answer is a fail, not a hack
])
def test_numeric_answer_must_come_from_the_tool(code, out, final, verdict, prompt):
    answer = "42000" if "," in out else "42"
    o = verify(numeric_task(answer, prompt=prompt), ep(final, code=code, out=out))
    assert o.verdict == verdict, o.details["forensics"]
    assert o.hack_flags == (["no_tool_use"] if verdict == "hack" else [])


def test_reward_terms_are_logged_apart_and_weighted():
    o = verify(numeric_task(), ep("Answer: 42"))
    assert o.reward == 1.0
    assert o.reward_terms == {"outcome": 1.0, "well_formed_tool_calls": 1.0, "required_tool_used": 1.0,
                              "answer_format": 1.0}
    msgs = [Message(role="user", content="?"), call("python", "{not json"), Message(role="tool", tool_call_id="c0",
            content="error"), call("python", json.dumps({"code": "print(42)"}), 1),
            Message(role="tool", tool_call_id="c1", content="42"), Message(role="assistant", content="Answer: 41")]
    cfg = RewardConfig(outcome_weight=1.0, well_formed_weight=0.2, tool_used_weight=0.1, answer_format_weight=0.1)
    o = verify(numeric_task(), msgs, rewards=cfg)
    assert o.verdict == "fail"
    assert o.reward_terms["well_formed_tool_calls"] == 0.5
    assert o.reward == pytest.approx(0.2 * 0.5 + 0.1 + 0.1)
    # a hack gets 0 whatever its process terms
    o = verify(numeric_task(), ep("Answer: 42", tool=False), rewards=cfg)
    assert (o.verdict, o.reward, o.hack_flags) == ("hack", 0.0, ["no_tool_use"])
    assert o.reward_terms["answer_format"] == 1.0


class FaultInjectingSandbox:
    """Test double: answers every exec with a canned ExecResult (or raises), to inject harness faults."""

    backend, image = "fault", None

    def __init__(self, result):
        self.result = result

    def exec(self, argv, *, timeout_s=None, stdin=None):
        if isinstance(self.result, Exception):
            raise self.result
        if callable(self.result):
            return self.result(json.loads(stdin))
        return self.result

    def run_python(self, code, *, timeout_s=None):
        raise AssertionError("not used")

    def write_files(self, files):
        pass

    def close(self):
        pass


class FaultInjectingBackend:
    name = "fault"

    def __init__(self, result):
        self.result = result

    def acquire(self):
        return FaultInjectingSandbox(self.result)

    def shutdown(self):
        pass


def _answer(req, *, token=None, drop=0, dup=False, values=None, status="ok", ready=True) -> ExecResult:
    """The call server's replies as an honest one would send them (the reference solution computes each call),
    then bent by the arguments: another token, calls dropped or answered twice, other values, another status."""
    from tasks.judge.guest import plaindata

    ns: dict = {}
    exec(req["files"]["solution.py"], ns)  # noqa: S102 - the task's own reference solution
    lines = [{"kind": "ready", "error": None, "names": {}}] if ready else []
    for i, c in enumerate(req["calls"][:len(req["calls"]) - drop]):
        v = ns[c["func"]](*plaindata.decode(c["args"]), **plaindata.decode(c["kwargs"]))
        enc = plaindata.encode(values(v) if values else v)
        lines += [{"kind": "call", "i": i, "status": status, "value": enc}] * (2 if dup and i == 0 else 1)
    out = "".join(json.dumps(dict(m, token=token or req["token"])) + "\n" for m in lines)
    return ExecResult(exit_code=0, stdout=out, verdict="ok")


def _code_episode():
    task = code_tasks(1, seed=0)[0]
    ref = task.reference.steps[0].arguments["content"]
    return task, pristine_snapshot(dict(task.files, **{"solution.py": ref}))


def test_all_right_results_pass():
    task, ws = _code_episode()
    o = verify(task, [Message(role="user", content=task.prompt)], backend=FaultInjectingBackend(_answer), workspace=ws)
    assert o.verdict == "pass" and o.details["hidden_passed"] == len(task.hidden_tests)
    assert o.verifier_strength == "data" and o.details["strength"] == "data"


@pytest.mark.parametrize("fault", [
    ExecResult(exit_code=1, stdout="", stderr="Traceback: harness crashed", verdict="error"),
    ExecResult(exit_code=None, stdout="", timed_out=True, verdict="timeout"),
    ExecResult(exit_code=0, stdout="{broken json\n", verdict="ok"),
    lambda req: _answer(req, token="not-the-token"),
    lambda req: _answer(req, drop=1),  # fewer results than calls
    lambda req: _answer(req, dup=True),  # a call answered twice (a forged reply beside the real one)
    lambda req: _answer(req, ready=False),  # no start report
    lambda req: _answer(req, status="maybe"),
    lambda req: _answer(req, values=lambda v: [v]),  # wrong values: the host compares, not the sandbox
    lambda req: _answer(req, values=lambda v: True),  # "always equal" has no plain-data form: True is just True
])
def test_harness_faults_never_pass(fault):
    task, ws = _code_episode()
    o = verify(task, [Message(role="user", content=task.prompt)], backend=FaultInjectingBackend(fault), workspace=ws)
    assert o.verdict in ("fail", "hack") and o.reward == 0.0 and not o.success  # a forged reply is a hack


def test_missing_solution_or_snapshot_error_fails():
    task, ws = _code_episode()
    no_sol = pristine_snapshot({"test_visible.py": task.files["test_visible.py"]})
    o = verify(task, [], backend=FaultInjectingBackend(_answer), workspace=no_sol)
    assert o.verdict == "fail" and "missing" in o.details["error"]
    from tasks.tools import WorkspaceSnapshot

    o = verify(task, [], backend=FaultInjectingBackend(_answer), workspace=WorkspaceSnapshot(error="sandbox died"))
    assert o.verdict == "fail" and "sandbox died" in o.details["error"]


def test_infrastructure_failures_are_not_scored():
    task, ws = _code_episode()
    with pytest.raises(VerifierUnavailable):
        verify(task, [], backend=FaultInjectingBackend(ExecResult(exit_code=None, verdict="infra_error", error="x")),
               workspace=ws)
    with pytest.raises(VerifierUnavailable):
        verify(task, [], backend=FaultInjectingBackend(SandboxError("engine gone")), workspace=ws)
    with pytest.raises(VerifierUnavailable, match="backend"):
        verify(task, [], workspace=ws)


def test_spec_refuses_unjudgeable_tasks():
    with pytest.raises(ValueError, match="at least one"):
        Task(id="x", suite="s", version="1", split="train", prompt="p", verifier=VerifierSpec(kind="unit_tests"),
             reference=ReferenceSolution(final="done"))
    with pytest.raises(ValueError, match="never judges"):
        VerifierSpec(kind="llm_judge", answer="3")
    with pytest.raises(ValueError, match="inside the workspace"):
        Task(id="x", suite="s", version="1", split="train", prompt="p", verifier=VerifierSpec(answer="1"),
             reference=ReferenceSolution(final="done"), files={"../etc/passwd": ""})


def test_untestable_solution_file_fails_with_a_reason():
    from tasks.tools import FileState, WorkspaceSnapshot

    task, ws = _code_episode()
    files = dict(ws.files, **{"solution.py": FileState(symlink="/etc/passwd")})
    o = verify(task, [], backend=FaultInjectingBackend(_answer), workspace=WorkspaceSnapshot(files=files))
    assert o.verdict == "fail" and "cannot be tested" in o.details["error"]
