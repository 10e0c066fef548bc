"""The `openai` task writer: an OpenAI-compatible endpoint asked for new tasks in a strict JSON schema.

`write_candidates(policy, seeds, n=...)` sends n chat requests through the project's client (agents/openai_policy.py:
retries, timeouts, token counts and USD from its price table), each showing the seed tasks in the schema of
tasks.factory.draft.ProposalSchema and asking for one new task; each reply becomes a Candidate: a draft, or
malformed_reply (not JSON, not the schema) or writer_error (the request failed after the client's retries) with
the reason, never an exception. Request i carries sample index i (the client turns it into the request's seed).
This module admits nothing (curate/synthesis.py does) and builds no folder.
"""

from __future__ import annotations

import asyncio
import json
import time

from agents.openai_policy import OpenAIPolicy
from agents.policy import EndpointError, ModelError, RequestRejected
from tasks.factory.draft import Candidate, MalformedProposal, ProposalSchema, TaskDraft, parse_proposal
from tasks.spec import ReferenceSolution, Task, VerifierSpec
from warehouse.record import Message

FAMILY = "openai"
SYSTEM = ("You write tasks for a software agent that works in a Linux container with a shell, under /app. "
          "Answer with exactly one JSON object and nothing else, with these keys: " +
          json.dumps({k: f.description for k, f in ProposalSchema.model_fields.items()}) +
          ". The test must check the agent's result in /app and must not be passable by doing nothing; the "
          "instruction must not state the expected answer.")


def seed_example(d: TaskDraft) -> dict[str, object]:
    """A seed task in the proposal schema (what the writer is shown)."""
    return {"name": d.name, "instruction": d.instruction, "files": d.files, "test_sh": d.tests["test.sh"],
            "test_files": {k: v for k, v in d.tests.items() if k != "test.sh"},
            "solve_sh": d.solution["solve.sh"]}


def _request_task(seeds: list[TaskDraft]) -> Task:
    """What the client's reply() is about: the writer's request, as a task without tools."""
    return Task(id="synth/writer-request", suite="synthesis", version="1", split="train",
                prompt="write a task", tools=[], verifier=VerifierSpec(kind="numeric", answer="0"),
                reference=ReferenceSolution(final="-"), metadata={"seeds": [s.name for s in seeds]})


async def _one(policy: OpenAIPolicy, seeds: list[TaskDraft], index: int) -> Candidate:
    user = ("Here are example tasks in the schema:\n" + "\n".join(json.dumps(seed_example(s)) for s in seeds) +
            f"\nWrite one new task (number {index}), different from these. Answer with the JSON object only.")
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=user)]
    cid = f"openai-{index}"
    names = [s.name for s in seeds]
    t0 = time.perf_counter()
    try:
        reply = await policy.reply(msgs, [], task=_request_task(seeds), sample_index=index)
    except (EndpointError, RequestRejected, ModelError) as e:
        return Candidate(candidate_id=cid, writer="openai", family=FAMILY, draft=None, problem="writer_error",
                         detail=f"{type(e).__name__}: {e}"[:500], seed_tasks=names,
                         writer_s=time.perf_counter() - t0)
    cost = {"seed_tasks": names, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "usd": reply.cost_usd, "writer_s": time.perf_counter() - t0}
    try:
        draft = parse_proposal(reply.message.content or "", family=FAMILY)
    except MalformedProposal as e:
        return Candidate(candidate_id=cid, writer="openai", family=FAMILY, draft=None, problem="malformed_reply",
                         detail=str(e)[:500], **cost)
    return Candidate(candidate_id=cid, writer="openai", family=FAMILY, draft=draft, **cost)


async def _all(policy: OpenAIPolicy, seeds: list[TaskDraft], n: int) -> list[Candidate]:
    async with policy.session():
        return list(await asyncio.gather(*(_one(policy, seeds, i) for i in range(n))))


def write_candidates(policy: OpenAIPolicy, seeds: list[TaskDraft], *, n: int) -> list[Candidate]:
    """n candidates from the endpoint, in request order (see the module docstring)."""
    if not seeds:
        raise ValueError("the openai writer needs at least one seed task")
    return asyncio.run(_all(policy, seeds, n))
