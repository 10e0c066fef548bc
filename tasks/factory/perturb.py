"""Perturbed oracles of a Harbor task, as episodes to judge: the oracle's work spoiled one way each.

`perturbed_oracles(task)` -> {kind: messages} for the kinds `wrong_value`, `missing_file` and `partial_work`: each
episode writes guest/perturb.py to /tmp/fw_perturb.py (a shell heredoc: write_file stays in the workspace),
snapshots the working directory, runs the oracle's own tool calls (the task's reference solution), saves the result,
then spoils what the oracle changed there (see guest/perturb.py). A sound checker fails all three.
`judge_perturbed(task, backend)` judges them the cheap way: the shared prefix runs once in one container of the
task, and each perturbation's last call there, judged with tasks.judge.api.verify from that open container (the
verifier copies the state into a fresh one, as for any episode). agents/audit.py calls it for the mutants of a
Harbor task (`audit_task(..., perturb=True)`).
"""

from __future__ import annotations

import json
from pathlib import Path

from sandbox.result import Backend, SandboxError
from tasks.judge.api import VerifierUnavailable
from tasks.spec import Task
from warehouse.record import FunctionCall, Message, ToolCall

PERTURBATIONS = ("wrong_value", "missing_file", "partial_work")
GUEST_PATH = "/tmp/fw_perturb.py"
_SOURCE = Path(__file__).with_name("guest") / "perturb.py"


def _call(i: int, tool: str, args: dict) -> ToolCall:
    return ToolCall(id=f"call_{i}", function=FunctionCall(name=tool, arguments=json.dumps(args)))


def _prefix(task: Task) -> list[ToolCall]:
    mark = "FLYWHEEL_PERTURB_EOF"
    write = f"cat > {GUEST_PATH} <<'{mark}'\n{_SOURCE.read_text()}{mark}\npython3 {GUEST_PATH} snapshot ."
    calls = [_call(0, "shell", {"command": write})]
    calls += [_call(1 + i, s.tool, s.arguments) for i, s in enumerate(task.reference.steps)]
    calls.append(_call(len(calls), "shell", {"command": f"python3 {GUEST_PATH} save ."}))
    return calls


def perturbed_episode(task: Task, kind: str) -> list[Message]:
    """The messages of one perturbed oracle (see the module docstring)."""
    if kind not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {kind!r}; known: {', '.join(PERTURBATIONS)}")
    calls = _prefix(task)
    calls.append(_call(len(calls), "shell", {"command": f"python3 {GUEST_PATH} {kind} ."}))
    msgs = [Message(role="user", content=task.prompt)]
    for c in calls:
        msgs.append(Message(role="assistant", content=None, tool_calls=[c]))
        msgs.append(Message(role="tool", tool_call_id=c.id, name=c.function.name, content="(replayed)"))
    msgs.append(Message(role="assistant", content=f"Done ({kind} perturbation of the oracle)."))
    return msgs


def perturbed_oracles(task: Task) -> dict[str, list[Message]]:
    """{kind: messages} for every kind of PERTURBATIONS."""
    return {k: perturbed_episode(task, k) for k in PERTURBATIONS}


def judge_perturbed(task: Task, backend: Backend) -> dict[str, bool]:
    """{kind: passed} for every perturbation of a Harbor task (see the module docstring). Raises
    VerifierUnavailable when the sandbox fails."""
    from tasks.harbor import acquire
    from tasks.judge.api import verify
    from tasks.tools import parse_arguments, run_tool

    out: dict[str, bool] = {}
    try:
        sb = acquire(task, backend)
    except (SandboxError, OSError) as e:
        raise VerifierUnavailable(f"no sandbox for the perturbed oracles of {task.id}: {e}") from e
    try:
        for c in _prefix(task):
            run_tool(sb, c.function.name, parse_arguments(c.function.name, c.function.arguments))
        for kind in PERTURBATIONS:
            msgs = perturbed_episode(task, kind)
            run_tool(sb, "shell", {"command": f"python3 {GUEST_PATH} {kind} ."})
            out[kind] = verify(task, msgs, backend=backend, agent_sandbox=sb).verdict == "pass"
    finally:
        sb.close()
    return out
