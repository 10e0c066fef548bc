"""The agentic task spec: one problem, its tools, how it is verified and how a reference solves it.

A Task is pure data (pydantic, JSON-serialisable). Suites produce Tasks; the episode loop reads them; verifiers
judge episodes against them. Hidden tests live only here and in the verifier's sandbox, never in the agent's.
This module does not generate, load or verify tasks.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolCallStep(BaseModel):
    """One tool call of a reference solution."""

    model_config = ConfigDict(extra="forbid")
    tool: str = Field(description="Tool name, e.g. 'python'.")
    arguments: dict[str, Any] = Field(description="Arguments of the call, e.g. {'code': 'print(2+3)'}.")


class ReferenceSolution(BaseModel):
    """How a competent agent solves the task: tool calls in order, then a final message."""

    model_config = ConfigDict(extra="forbid")
    steps: list[ToolCallStep] = Field(default_factory=list)
    final: str = Field(description="The final assistant message, e.g. 'Answer: 42'.")


class VerifierSpec(BaseModel):
    """Which verifier judges the task and with what expectations."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["numeric", "unit_tests", "llm_judge"] = "numeric"
    answer: str | None = Field(default=None, description="Expected answer (numeric verifier).")
    tolerance: float = Field(default=1e-6, description="Absolute/relative tolerance for numeric answers.")
    requires_tool: str | None = Field(default=None, description="Tool the episode must use, else no_tool_use.")


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    suite: str
    version: str
    split: Literal["train", "heldout"]
    prompt: str = Field(description="The user's request.")
    system: str | None = Field(default=None, description="Optional system prompt before the tool instructions.")
    tools: list[str] = Field(default_factory=lambda: ["python"], description="Names of tools the task exposes.")
    verifier: VerifierSpec
    reference: ReferenceSolution
    visible_tests: list[str] = Field(default_factory=list)
    hidden_tests: list[str] = Field(default_factory=list)
    difficulty: int = 1
    metadata: dict[str, Any] = Field(default_factory=dict)
