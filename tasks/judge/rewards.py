"""Rewards: the verifier's outcome plus optional weighted process terms, each logged apart from the outcome.

Process terms, each in [0, 1]: `well_formed_tool_calls` (share of tool calls whose name is one of the task's tools
and whose arguments parse; 0 when a task with tools saw no call, 1 for a task without tools), `required_tool_used`
(1 when the task's required tool was called well-formed, or when no tool is required), `answer_format` (numeric
tasks: the last assistant message holds 'Answer: N'; other tasks: the episode ends with an assistant message that
has text and no tool call). The reward is
outcome_weight * outcome + the weighted terms, and 0 for a hack. Every term is logged whatever its weight.
This module does not verify anything.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tasks.judge.answers import ANSWER_RE
from tasks.spec import Task
from tasks.tools import ToolArgumentError, parse_arguments
from warehouse.record import Message


class RewardConfig(BaseModel):
    """Weights of the reward's parts. The defaults make the reward the outcome alone."""

    outcome_weight: float = Field(default=1.0, ge=0, description="Weight of the verifier's outcome (0 or 1).")
    well_formed_weight: float = Field(default=0.0, ge=0, description="Weight of well-formed tool calls.")
    tool_used_weight: float = Field(default=0.0, ge=0, description="Weight of the required tool being used.")
    answer_format_weight: float = Field(default=0.0, ge=0, description="Weight of the final answer's format.")


def process_terms(task: Task, messages: list[Message]) -> dict[str, float]:
    calls = [tc for m in messages if m.role == "assistant" and m.tool_calls for tc in m.tool_calls]
    good = 0
    used_required = False
    for tc in calls:
        try:
            parse_arguments(tc.function.name, tc.function.arguments, task.tool_specs)
        except ToolArgumentError:
            continue
        if tc.function.name in task.tools:
            good += 1
            used_required = used_required or tc.function.name == task.verifier.requires_tool
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if task.verifier.kind == "numeric":
        fmt = bool(last and last.content and ANSWER_RE.search(last.content))
    else:
        fmt = bool(last and (last.content or "").strip() and not last.tool_calls)
    return {
        "well_formed_tool_calls": good / len(calls) if calls else (0.0 if task.tools else 1.0),
        "required_tool_used": 1.0 if (task.verifier.requires_tool is None or used_required) else 0.0,
        "answer_format": 1.0 if fmt else 0.0,
    }


def combine(outcome: float, terms: dict[str, float], config: RewardConfig, *, hack: bool) -> float:
    if hack:
        return 0.0
    return (config.outcome_weight * outcome + config.well_formed_weight * terms["well_formed_tool_calls"]
            + config.tool_used_weight * terms["required_tool_used"]
            + config.answer_format_weight * terms["answer_format"])
