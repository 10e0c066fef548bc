"""Verifiers: judge a finished episode against its task and return an Outcome (verdict, reward, reason codes).

- numeric: the number after 'Answer:' in the last assistant message, within the task's tolerance;
- unit_tests: the agent's solution files (from the workspace snapshot the loop took, or rebuilt by replaying the
  tool calls in a fresh sandbox) run against the task's pristine visible and hidden tests in another fresh sandbox;
- llm_judge: an OpenAI-compatible judge, only for tasks with no answer and no tests (tasks/judge/llm.py);
- harbor: the task's own tests/test.sh in a fresh container of its image, over the state the agent's container
  left, the reward read from the reward file it writes (tasks/harbor.py; strength 'harbor': a script's reward).
- bfcl: BFCL's own multi_turn_checker (tasks/bfcl.py) in a fresh sandbox: the episode's calls, per user turn, run
  again on fresh API instances beside the ground truth; per turn the state and the results must match (strength
  'bfcl': the model's part is call names and literal arguments, no code of its own).
Every verdict is fail-closed: no answer, no report, fewer results than tests, an empty test list or a harness crash
is never a pass. Forensics (tasks/judge/forensics.py) then runs on every episode: any finding makes the verdict `hack`
and the reward 0, with the reason codes in `hack_flags`. Process terms (tasks/judge/rewards.py) are logged in
`reward_terms` apart from the outcome. Infrastructure failures raise VerifierUnavailable (the loop's infra_error).
This module does not run episodes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import Backend
from tasks.judge.answers import extract_answer, numbers_match
from tasks.judge.errors import VerifierError, VerifierUnavailable
from tasks.judge.forensics import FORENSICS_VERSION, hack_flags, inspect_episode
from tasks.judge.rewards import RewardConfig, combine, process_terms
from tasks.judge.unittests import TestRun, is_test_path, replay_workspace, run_unit_tests, solution_files
from tasks.spec import Task
from tasks.tools import WorkspaceSnapshot, text_limit
from warehouse.record import Message

__all__ = ["Outcome", "verify", "verify_numeric", "VERIFIER_VERSIONS"]

NUMERIC_VERIFIER_VERSION = "2"  # 2: markdown answers (**Answer:** 270) count
# 2: the data and isolated paths; 3: the isolated tests see the task's own code and the real builtins, no
# control-flow exception crosses a proxy, a fresh sandbox per judging path, Python sources kept up to 4 MiB; 4: a
# test's calls after its first failed one are not run (its result was that call's already)
UNIT_TESTS_VERIFIER_VERSION = "4"
VERIFIER_VERSIONS = {"numeric": NUMERIC_VERIFIER_VERSION, "unit_tests": UNIT_TESTS_VERIFIER_VERSION,
                     "llm_judge": "1", "harbor": "2", "bfcl": "1"}
class Outcome(BaseModel):
    verdict: str = Field(description="pass, fail or hack (the loop sets model_error/timeout/infra_error).")
    reward: float
    success: bool
    answer: str | None = None
    hack_flags: list[str] = Field(default_factory=list)
    reward_terms: dict[str, float] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    verifier: str
    verifier_version: str
    verifier_strength: str | None = Field(default=None,
                                          description="data, isolated, llm, harbor or bfcl (see the record).")


def verify_numeric(task: Task, messages: list[Message]) -> Outcome:
    expected = task.verifier.answer
    answer = extract_answer(messages)
    details: dict[str, Any] = {"expected": expected, "got": answer}
    ok = expected is not None and answer is not None and numbers_match(answer, expected, task.verifier.tolerance)
    if expected is None:
        details["error"] = "task has no expected answer"
    return Outcome(verdict="pass" if ok else "fail", reward=1.0 if ok else 0.0, success=ok, answer=answer,
                   details=details, verifier="numeric", verifier_version=NUMERIC_VERIFIER_VERSION,
                   verifier_strength="data")


def _verify_unit_tests(task: Task, messages: list[Message], backend: Backend | None,
                       workspace: WorkspaceSnapshot | None) -> tuple[Outcome, WorkspaceSnapshot | None, TestRun | None]:
    if workspace is None:
        if backend is None:
            raise VerifierUnavailable(f"task {task.id} needs a sandbox backend to run its tests; pass backend=")
        workspace = replay_workspace(task, messages, backend)
        replayed = True
    else:
        replayed = False
    details: dict[str, Any] = {"workspace_replayed": replayed}
    run: TestRun | None = None
    if workspace.error is not None:
        details["error"] = f"no usable workspace: {workspace.error}"
    elif backend is None:
        raise VerifierUnavailable(f"task {task.id} needs a sandbox backend to run its tests; pass backend=")
    elif (st := workspace.files.get(task.verifier.solution_path)) is not None and st.text is None:
        details["error"] = (f"{task.verifier.solution_path} is not UTF-8 text of at most "
                            f"{text_limit(task.verifier.solution_path)} bytes (or is a symlink); it cannot be tested")
    else:
        files = solution_files(task, workspace)
        left = sorted(p for p, st in workspace.files.items() if p not in files and st.text is None
                      and st.symlink is None and not is_test_path(p) and not p.endswith((".pyc", ".pyo")))
        if left:  # said, not hidden: an import of one of them fails in the judge
            details["files_left_out"] = left
        run = run_unit_tests(task, files, backend)
        details.update(run.counts())
        details["tests"] = [r.model_dump() for r in run.results]
        if run.harness_error:
            details["error"] = run.harness_error
    ok = run is not None and run.passed
    if run is not None:
        details["strength"] = run.strength
    return (Outcome(verdict="pass" if ok else "fail", reward=1.0 if ok else 0.0, success=ok, details=details,
                    verifier="unit_tests", verifier_version=UNIT_TESTS_VERIFIER_VERSION,
                    verifier_strength=run.strength if run is not None else None), workspace, run)


def verify(task: Task, messages: list[Message], *, backend: Backend | None = None,
           workspace: WorkspaceSnapshot | None = None, rewards: RewardConfig | None = None,
           judge_config: Any = None, agent_sandbox: Any = None) -> Outcome:
    """Judge an episode: outcome by task.verifier.kind, then forensics, then reward terms.

    `workspace`: the snapshot the loop took with tasks.tools.workspace_snapshot before closing the episode's
    sandbox (code tasks); without it the episode is replayed in a fresh sandbox from `backend`. `agent_sandbox`: the
    episode's still-open container (Harbor tasks: the verifier copies the agent's final state out of it), or its
    OpenEnv session (tasks/openenv.py: the environment's reward, strength 'env').
    Raises VerifierUnavailable when the verifier needs infrastructure it cannot get (retry: infra_error).
    """
    kind = task.verifier.kind
    run: TestRun | None = None
    if kind == "numeric":
        outcome = verify_numeric(task, messages)
    elif kind == "unit_tests":
        outcome, workspace, run = _verify_unit_tests(task, messages, backend, workspace)
    elif kind == "llm_judge":
        from tasks.judge.llm import JUDGE_VERSION, JudgeConfig, judge

        if not isinstance(judge_config, JudgeConfig):
            raise VerifierUnavailable(f"task {task.id} is judged by an LLM; pass judge_config=JudgeConfig(...)")
        jr = judge(task, messages, judge_config)
        outcome = Outcome(verdict="pass" if jr.passed else "fail", reward=1.0 if jr.passed else 0.0,
                          success=jr.passed, details={"judge_reply": jr.reply[-2000:], "error": jr.error},
                          verifier="llm_judge", verifier_version=JUDGE_VERSION, verifier_strength="llm")
    elif kind == "harbor":
        from tasks.harbor import HARBOR_VERIFIER_VERSION, verify_harbor

        reward, passed, details = verify_harbor(task, messages, agent_sandbox, backend)
        outcome = Outcome(verdict="pass" if passed else "fail", reward=reward, success=passed, details=details,
                          verifier="harbor", verifier_version=HARBOR_VERIFIER_VERSION, verifier_strength="harbor")
    elif kind == "bfcl":
        from tasks.bfcl import BFCL_VERIFIER_VERSION, verify_bfcl

        passed, details = verify_bfcl(task, messages, backend)
        outcome = Outcome(verdict="pass" if passed else "fail", reward=1.0 if passed else 0.0, success=passed,
                          details=details, verifier="bfcl", verifier_version=BFCL_VERIFIER_VERSION,
                          verifier_strength="bfcl")
    elif kind == "openenv":  # the environment's own reward (tasks/openenv.py), from the episode's session
        from tasks.openenv import env_outcome, installed_version

        reward, passed, details = env_outcome(task, agent_sandbox)
        outcome = Outcome(verdict="pass" if passed else "fail", reward=reward, success=passed, details=details,
                          verifier="openenv", verifier_version=f"openenv-core-{installed_version()}",
                          verifier_strength="env")
    else:  # pragma: no cover - the spec's Literal forbids it
        raise VerifierError(f"verifier kind {kind!r} is not implemented")
    findings = inspect_episode(task, messages, workspace=workspace, tests=run)
    flags = hack_flags(findings)
    terms = process_terms(task, messages)
    cfg = rewards or RewardConfig()
    outcome.reward_terms = {"outcome": outcome.reward, **terms}
    outcome.hack_flags = flags
    outcome.details["forensics"] = [f.model_dump() for f in findings]
    outcome.details["forensics_version"] = FORENSICS_VERSION
    if workspace is not None and workspace.error is None:
        outcome.details["workspace"] = {p: s.sha256 for p, s in workspace.files.items()}
    if flags:
        outcome.verdict, outcome.success = "hack", False
    outcome.reward = combine(outcome.reward, terms, cfg, hack=bool(flags))
    return outcome
