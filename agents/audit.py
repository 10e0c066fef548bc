"""Verifier health: per task, the oracle, a null agent, mutants of the oracle and K re-grades, as rows.

`audit_task(task, backend, k=...)` runs, through the real episode loop (agents/loop.py) and the real judge
(tasks/judge/verify.py):
- the oracle: the reference teacher (agents/reference.py, no noise) -- its episode must pass;
- the null agent (`NullPolicy`): one final message, no tool call, nothing written -- it must fail;
- mutants of the oracle's code where the task has code (unit-test tasks whose reference writes
  verifier.solution_path and names an entry point): tasks/humaneval.py's deterministic ast mutants of that file,
  each judged as an episode that writes the mutant and stops -- each should fail (mutant_kill_rate: the share
  that fail; None where there are none, e.g. Harbor's shell oracles); a BFCL task's mutants are the oracle's
  episode with one call left out (tasks.bfcl.dropped_calls); with `perturb=True`, a Harbor task's mutants are its
  perturbed oracles (tasks/factory/perturb.py: wrong value, missing file, partial work), judged only when the
  oracle passes; `mutant_survivors` names the mutants that passed;
- K re-grades of the oracle's final state: the oracle's messages judged again K times (code and Harbor tasks:
  replayed in a fresh sandbox each time); flake_rate is the share of re-grades whose pass/fail differs from the
  oracle episode's own verdict.
An infra failure of one task is that row's `error` (and it is unhealthy), never a crash of the audit.
This module does not write the lake (flows/cli.py does, table verifier_health), does not judge health against
thresholds (curate/health.py does) and prints nothing.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, Field

from agents.loop import run_episode
from agents.policy import PolicyReply
from agents.reference import ReferencePolicy
from sandbox.result import Backend
from tasks.humaneval import episode_messages, mutants
from tasks.judge.api import VERIFIER_VERSIONS, VerifierUnavailable, verify
from tasks.spec import Task
from warehouse.record import Message, Source


class NullPolicy:
    """An agent that does nothing: it answers once, with no tool call and no answer."""

    name = "null"
    source: Source = "teacher"
    endpoint: str | None = None

    @property
    def sampling(self) -> dict[str, Any]:
        return {}

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        return PolicyReply(message=Message(role="assistant", content="I did nothing."), finish_reason="stop")


class HealthRow(BaseModel):
    """One row of the lake's verifier_health table."""

    task_id: str
    suite: str
    task_version: str
    verifier: str
    verifier_version: str
    oracle_pass: bool
    null_pass: bool
    n_mutants: int
    mutants_killed: int
    mutant_kill_rate: float | None = Field(description="Share of mutants that fail; None when the task has none.")
    mutant_survivors: list[str] = Field(default_factory=list,
                                        description="The mutants that passed (kinds of perturbed oracles, or "
                                                    "mutant-<i>).")
    k_regrades: int
    flake_rate: float
    wall_s: float
    error: str | None = Field(default=None, description="Why the audit of this task could not finish, if so.")


def oracle_mutants(task: Task) -> list[str]:
    """Whole-file mutants of the reference's solution file (empty where the task has no such code)."""
    entry = task.metadata.get("entry_point")
    if task.verifier.kind != "unit_tests" or not isinstance(entry, str):
        return []
    target = task.verifier.solution_path.lstrip("./")
    src = next((s.arguments.get("content") for s in reversed(task.reference.steps) if s.tool == "write_file"
                and str(s.arguments.get("path", "")).lstrip("./") == target), None)
    if not isinstance(src, str):
        return []
    try:
        return [m.source for m in mutants({"task_id": task.id, "prompt": src, "canonical_solution": "",
                                           "entry_point": entry})]
    except SyntaxError:
        return []


def _variants(task: Task, oracle_messages: list[Message], oracle_pass: bool) -> dict[str, list[Message]]:
    """name -> the messages of each mutant of the task's oracle episode."""
    if task.verifier.kind == "bfcl":  # its mutants: the oracle's episode with one call left out
        from tasks.bfcl import dropped_calls

        return {f"dropped-call-{i}": v for i, v in enumerate(dropped_calls(oracle_messages) if oracle_pass else [])}
    return {f"mutant-{i}": episode_messages(task, s) for i, s in enumerate(oracle_mutants(task))}


def audit_task(task: Task, backend: Backend, *, k: int = 3, max_turns: int = 8, perturb: bool = False) -> HealthRow:
    """Audit one task's verifier (see the module docstring)."""
    t0 = time.perf_counter()
    base: dict[str, Any] = {"task_id": task.id, "suite": task.suite, "task_version": task.version,
                            "verifier": task.verifier.kind,
                            "verifier_version": VERIFIER_VERSIONS.get(task.verifier.kind, "?")}
    oracle = asyncio.run(run_episode(task, ReferencePolicy(), backend, run_id="audit", max_turns=max_turns))
    null = asyncio.run(run_episode(task, NullPolicy(), backend, run_id="audit", max_turns=max_turns))
    errors = [f"{who}: {r.verdict} {r.error_class}: {r.error_message}" for who, r in (("oracle", oracle),
              ("null", null)) if r.verdict == "infra_error"]
    oracle_pass = oracle.verdict == "pass"
    try:
        if task.verifier.kind == "harbor" and perturb:  # judged from one oracle run (tasks/factory/perturb.py)
            from tasks.factory.perturb import judge_perturbed

            passed = judge_perturbed(task, backend) if oracle_pass else {}
            sources, survivors = list(passed), [kind for kind, ok in passed.items() if ok]
        else:
            variants = _variants(task, oracle.messages, oracle_pass)
            sources = list(variants)
            survivors = [name for name, v in variants.items() if verify(task, v, backend=backend).verdict == "pass"]
        killed = len(sources) - len(survivors)
        regrades = [verify(task, oracle.messages, backend=backend).verdict == "pass" for _ in range(k)]
    except VerifierUnavailable as e:
        errors.append(f"regrade: {e}")
        sources, survivors, killed, regrades = [], [], 0, []
    return HealthRow(**base, oracle_pass=oracle_pass, null_pass=null.verdict == "pass", n_mutants=len(sources),
                     mutants_killed=killed, mutant_kill_rate=killed / len(sources) if sources else None,
                     mutant_survivors=survivors,
                     k_regrades=len(regrades),
                     flake_rate=sum(g != oracle_pass for g in regrades) / len(regrades) if regrades else 0.0,
                     wall_s=round(time.perf_counter() - t0, 3), error="; ".join(errors) or None)


def audit_tasks(tasks: list[Task], backend: Backend, *, k: int = 3, workers: int = 4,
                max_turns: int = 8, perturb: bool = False) -> list[HealthRow]:
    """audit_task over `tasks`, `workers` at once; rows in the tasks' order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda t: audit_task(t, backend, k=k, max_turns=max_turns, perturb=perturb), tasks))
