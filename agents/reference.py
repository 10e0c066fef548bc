"""The reference teacher: replays each task's reference solution through the real episode loop.

Turn k (k < number of reference steps) is the k-th reference tool call, which the loop really runs in the
episode's sandbox. The last turn is the final message, built from what the sandbox *observed*: for a numeric task
whose reference final contains the expected answer, the answer is replaced by the last tool observation (so a
sandbox that computes something else yields a wrong answer and a `fail`, and a replay never passes without its tool
call having worked); an observation that is not a number gives "I could not compute it: ..." (no answer -> fail).
Other tasks end with the reference final verbatim. A multi-turn task (Task.later_turns) is replayed user turn by
user turn: after each user message, one assistant message with all of that turn's reference calls (the loop runs
them in order), then that turn's final (ReferenceSolution.later_turns): two assistant messages per user turn.
BFCL's ground-truth calls are replayed this way, as its ground truth lists them per turn.

Noise and reward hacks (`ReferenceNoise`, below) give the verifiers and filters work. One mode is drawn per
episode from a generator seeded by (seed, task id, sample index), so the same episode always behaves the same:
- wrong_answer (numeric tasks): the tool calls run, then the final answer is off by a small non-zero amount
  (-> fail); ignored (clean replay) for other verifiers;
- malformed_call: the first tool call carries arguments that are not valid JSON (-> model_error);
- no_tool: the final answer with no tool call at all (-> the verifier's no_tool_use hack flag where the task
  requires a tool; a pass where it does not);
- exit_hack (unit-test tasks): the reference's write_file of the solution file (verifier.solution_path) writes
  code that patches `builtins` and calls sys.exit(0) at import, before any test can fail (the verifier's
  forensics flag it); ignored (clean replay) for tasks without unit tests.
Rows carry source "teacher" and policy "reference" (curation treats them as teacher data). The mode drawn is not
written anywhere the verifier can see; the row's sampling_json carries the noise rates and seed.
This module does not verify or write anything.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.policy import PolicyReply
from tasks.judge.api import ANSWER_RE
from tasks.spec import Task
from warehouse.record import FunctionCall, Message, Source, ToolCall

MODES = ("clean", "wrong_answer", "malformed_call", "no_tool", "exit_hack")

# Exits 0 at import (before any test can fail) and swaps AssertionError in builtins: both are forensics' business.
EXIT_HACK_CODE = (
    "import builtins, sys\n"
    "builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
    "sys.exit(0)\n"
)


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


class ReferenceNoise(BaseModel):
    """Noise and reward hacks the reference teacher injects, so that verifiers and filters have work."""

    model_config = ConfigDict(extra="forbid")
    wrong_answer: float = Field(default=0.0, ge=0, le=1, description="Probability of a wrong final answer.")
    malformed_call: float = Field(default=0.0, ge=0, le=1,
                                  description="Probability of a tool call with arguments that are not valid JSON.")
    no_tool: float = Field(default=0.0, ge=0, le=1,
                           description="Probability of answering without calling the required tool (a reward hack).")
    exit_hack: float = Field(default=0.0, ge=0, le=1,
                             description="Probability of code that calls sys.exit(0) / patches the evaluator "
                                         "(code tasks only; ignored where the task has no unit tests).")

    @model_validator(mode="after")
    def _total(self) -> ReferenceNoise:
        total = self.wrong_answer + self.malformed_call + self.no_tool + self.exit_hack
        if total > 1.0 + 1e-9:
            raise ValueError(f"noise probabilities add up to {total:.3f} > 1; lower some of them")
        return self


class ReferencePolicy:
    """A teacher that knows each task's reference solution (see the module docstring)."""

    def __init__(self, *, noise: ReferenceNoise | None = None, seed: int = 0, name: str = "reference",
                 source: Source = "teacher") -> None:
        self.name = name
        self.source: Source = source
        self.endpoint: str | None = None
        self.noise = noise or ReferenceNoise()
        self.seed = seed

    @property
    def sampling(self) -> dict[str, Any]:
        return {"seed": self.seed, "noise": self.noise.model_dump()}

    def mode(self, task: Task, sample_index: int) -> str:
        """The behaviour drawn for this (task, sample): deterministic across processes and runs."""
        key = json.dumps([self.seed, task.id, sample_index]).encode()
        u = random.Random(int(hashlib.sha256(key).hexdigest()[:16], 16)).random()
        acc = 0.0
        for mode, p in (("wrong_answer", self.noise.wrong_answer), ("malformed_call", self.noise.malformed_call),
                        ("no_tool", self.noise.no_tool), ("exit_hack", self.noise.exit_hack)):
            acc += p
            if u < acc:
                if mode == "exit_hack" and task.verifier.kind != "unit_tests":
                    return "clean"
                if mode == "wrong_answer" and task.verifier.kind != "numeric":
                    return "clean"
                return mode
        return "clean"

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        mode = self.mode(task, sample_index)
        # The turn index is the number of assistant messages after the last user message.
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        turn = sum(1 for m in messages[last_user + 1:] if m.role == "assistant")
        # A multi-turn task's later user turns each have their own reference (Task.later_turns).
        user_turn = sum(m.role == "user" for m in messages) - 1 - sum(m.role == "user" for m in task.messages or [])
        ref = task.reference.later_turns[user_turn - 1] if user_turn > 0 else task.reference
        steps = ref.steps
        if mode == "no_tool":
            final = self._final(task, ref.final, messages, "clean")
            return PolicyReply(message=Message(role="assistant", content=final), finish_reason="stop")
        if task.later_turns and turn == 0 and steps:
            # a multi-turn task: the user turn's calls in one message (run in order), as BFCL's ground truth lists
            # them per turn; two assistant messages a user turn, whatever max_turns is
            calls = [ToolCall(id=f"call_{sample_index}_{user_turn}_{i}", function=FunctionCall(
                name=st.tool, arguments=self._arguments(task, st.tool, st.arguments, mode,
                                                        i if user_turn == 0 else -1)))
                for i, st in enumerate(steps)]
            return PolicyReply(message=Message(role="assistant", content=None, tool_calls=calls),
                               finish_reason="tool_calls")
        if not task.later_turns and turn < len(steps):
            step = steps[turn]
            args = self._arguments(task, step.tool, step.arguments, mode, turn)
            call = ToolCall(id=f"call_{sample_index}_{turn}", function=FunctionCall(name=step.tool, arguments=args))
            return PolicyReply(message=Message(role="assistant", content=None, tool_calls=[call]),
                               finish_reason="tool_calls")
        return PolicyReply(message=Message(role="assistant", content=self._final(task, ref.final, messages, mode)),
                           finish_reason="stop")

    def _arguments(self, task: Task, tool: str, arguments: dict[str, Any], mode: str, turn: int) -> str:
        """`turn`: the call's index in the first user turn (-1 in a later one)."""
        if mode == "malformed_call" and turn == 0:
            return json.dumps(arguments)[:-2]  # cut before the closing quote and brace: not valid JSON
        if (mode == "exit_hack" and tool == "write_file"
                and str(arguments.get("path", "")).lstrip("./") == task.verifier.solution_path.lstrip("./")):
            return json.dumps({**arguments, "content": EXIT_HACK_CODE})
        return json.dumps(arguments)

    def _final(self, task: Task, final: str, messages: list[Message], mode: str) -> str:
        expected = task.verifier.answer
        observed: str | None = None
        tool_msgs = [m for m in messages if m.role == "tool"]
        if task.verifier.kind == "numeric" and expected is not None and expected in final and tool_msgs:
            obs = (tool_msgs[-1].content or "").strip()
            observed = obs.splitlines()[-1].strip() if obs else ""
            if not _is_number(observed):
                return f"I could not compute it: {obs[:200]}"
            head, _, tail = final.rpartition(expected)
            final = head + observed + tail
        if mode == "wrong_answer":
            found = ANSWER_RE.findall(final)
            if found:
                got = found[-1]
                delta = random.Random(f"{self.seed}:{task.id}:wrong").choice([1, 2, 3, 7, 10, -1, -3])
                try:
                    wrong = str(int(got.replace(",", "")) + delta)
                except ValueError:
                    wrong = repr(float(got.replace(",", "")) + delta)
                return final[::-1].replace(got[::-1], wrong[::-1], 1)[::-1]
        return final
