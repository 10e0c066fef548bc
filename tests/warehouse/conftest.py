"""Fixtures for the warehouse tests: a factory of small, valid trajectories."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from warehouse.record import FunctionCall, Message, ToolCall, Trajectory, trajectory_id


def make_trajectory(i: int, run_id: str = "run-a", round: int = 0, **over) -> Trajectory:
    """A small but complete episode: user prompt, one python tool call, its result, a final answer."""
    source = over.pop("source", "teacher")
    policy = over.pop("policy", "ref-teacher")
    task_id = over.pop("task_id", f"arith-{i % 7:03d}")
    verdict = over.pop("verdict", "pass" if i % 3 else "fail")
    args = json.dumps({"code": f"print({i} + 1)"})
    fields = dict(  # noqa: C408
        trajectory_id=trajectory_id(run_id, round, task_id, policy, i),
        run_id=run_id,
        round=round,
        source=source,
        policy=policy,
        sample_index=i,
        task_id=task_id,
        suite=over.pop("suite", "arithmetic"),
        split=over.pop("split", "train"),
        task_version="1",
        verifier="numeric",
        verifier_version="1",
        messages=[
            Message(role="system", content="Use the python tool."),
            Message(role="user", content=f"What is {i} + 1?"),
            Message(role="assistant", content=None,
                    tool_calls=[ToolCall(id=f"c{i}", function=FunctionCall(name="python", arguments=args))]),
            Message(role="tool", content=f"{i + 1}\n", tool_call_id=f"c{i}", name="python"),
            Message(role="assistant", content=f"Answer: {i + 1}"),
        ],
        tools_json=json.dumps([{"type": "function", "function": {
            "name": "python", "description": "Run Python.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]),
        answer=str(i + 1),
        reward=1.0 if verdict == "pass" else 0.0,
        success=verdict == "pass",
        verdict=verdict,
        turns=2,
        n_tool_calls=1,
        prompt_tokens=100 + i,
        completion_tokens=20 + i,
        created_at=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=i),
    )
    fields.update(over)
    return Trajectory(**fields)


@pytest.fixture
def traj():
    return make_trajectory
