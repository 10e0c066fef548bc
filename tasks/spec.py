"""The agentic task spec: one problem, its tools, how it is verified and how a reference solves it.

A Task is pure data (pydantic, JSON-serialisable). Suites produce Tasks; the episode loop reads them; verifiers
judge episodes against them. Hidden tests live only here and in the verifier's fresh sandbox, never in the agent's
workspace: `files` is what the agent's workspace starts with (for code tasks: the starter solution and the
visible tests). A multi-turn task (BFCL's) adds `later_turns` (user messages delivered after each model turn, with
`reference.later_turns` answering them) and `tool_specs` (schemas of tools of its own). This module does not
generate, load or verify tasks.
"""

from __future__ import annotations

import posixpath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from warehouse.record import Message


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
    later_turns: list[ReferenceSolution] = Field(
        default_factory=list, description="How the reference answers each of the task's later_turns, in order "
                                          "(multi-turn tasks): its calls, then its message that ends the turn.")


class VerifierSpec(BaseModel):
    """Which verifier judges the task and with what expectations."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["numeric", "unit_tests", "llm_judge", "harbor", "bfcl", "openenv"] = "numeric"
    answer: str | None = Field(default=None, description="Expected answer (numeric verifier).")
    tolerance: float = Field(default=1e-6, description="Absolute/relative tolerance for numeric answers.")
    requires_tool: str | None = Field(default=None, description="Tool the episode must use, else no_tool_use.")
    solution_path: str = Field(default="solution.py",
                               description="Workspace file holding the agent's code (unit_tests verifier).")
    timeout_s: float = Field(default=5.0, gt=0, description=(
        "Wall-clock limit of one test (unit_tests verifier), in seconds; where the judge runs a test's calls of the "
        "solution apart (its data and isolated paths), of each call: a call past it fails the test, whose later "
        "calls are not run."))
    float_tolerance: float = Field(
        default=0.0, ge=0, description="Unit tests: relative/absolute tolerance for floats in `f(...) == EXPECTED` "
                                       "checks, applied on the host; 0 compares exactly, as the test's own `==`.")
    rubric: str | None = Field(default=None, description="What a good answer must do (llm_judge verifier).")

    @model_validator(mode="after")
    def _judge_never_alone(self) -> VerifierSpec:
        if self.kind == "llm_judge" and self.answer is not None:
            raise ValueError("an llm_judge verifier never judges a task that has an expected answer; "
                             "use kind='numeric' for it")
        return self


def _safe_relpath(p: str) -> str:
    norm = posixpath.normpath(p)
    if not p or p.startswith("/") or norm.startswith("..") or norm == ".":
        raise ValueError(f"workspace path {p!r} must be relative and stay inside the workspace")
    return norm


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    suite: str
    version: str
    split: Literal["train", "heldout"]
    prompt: str = Field(description="The user's request.")
    system: str | None = Field(default=None, description="Optional system prompt before the tool instructions.")
    messages: list[Message] | None = Field(
        default=None, description="Earlier turns placed between the system prompt and the prompt (few-shot).")
    tools: list[str] = Field(default_factory=lambda: ["python"], description="Names of tools the task exposes.")
    tool_specs: list[dict[str, Any]] = Field(
        default_factory=list, description="Schemas (OpenAI function format) of tools the task defines itself, beyond "
                                          "the built-in ones of tasks/tools.py (BFCL's API functions); each is named "
                                          "in `tools`.")
    later_turns: list[str] = Field(
        default_factory=list, description="User messages after the prompt, delivered one at a time: each when the "
                                          "model ends a turn with a message without tool calls (multi-turn tasks).")
    verifier: VerifierSpec
    reference: ReferenceSolution
    visible_tests: list[str] = Field(default_factory=list,
                                     description="Test snippets the agent sees (also in `files`).")
    hidden_tests: list[str] = Field(default_factory=list,
                                    description="Test snippets only the verifier's fresh sandbox sees.")
    files: dict[str, str] = Field(default_factory=dict,
                                  description="Relative path -> text: the agent's workspace at the first turn.")
    difficulty: int = 1
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("files")
    @classmethod
    def _files_inside(cls, v: dict[str, str]) -> dict[str, str]:
        return {_safe_relpath(k): c for k, c in v.items()}

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        if self.verifier.kind == "unit_tests" and not (self.visible_tests or self.hidden_tests):
            raise ValueError("a unit_tests task needs at least one visible or hidden test")
        if self.verifier.kind == "llm_judge" and (self.visible_tests or self.hidden_tests):
            raise ValueError("an llm_judge verifier never judges code that has tests; use kind='unit_tests'")
        if self.verifier.kind == "numeric" and self.verifier.answer is None:
            raise ValueError("a numeric task needs verifier.answer")
        if len(self.reference.later_turns) != len(self.later_turns):
            raise ValueError(f"the task has {len(self.later_turns)} later turn(s) but its reference answers "
                             f"{len(self.reference.later_turns)}; give reference.later_turns one per later turn")
        unnamed = [s.get("function", {}).get("name") for s in self.tool_specs
                   if s.get("function", {}).get("name") not in self.tools]
        if unnamed:
            raise ValueError(f"tool_specs {unnamed} are not named in tools; add them to tools")
        return self


def conversation(task: Task) -> list[Message]:
    """The task's opening turns: its system prompt (if any), its earlier turns (if any), then the prompt."""
    out: list[Message] = []
    if task.system:
        out.append(Message(role="system", content=task.system))
    out.extend(task.messages or [])
    out.append(Message(role="user", content=task.prompt))
    return out
