"""The episode loop: one task, one policy, one sandbox -> one `Trajectory` row, whatever happens.

`run_episode` builds the opening messages (system + user) and the task's tool schemas, then alternates: the
policy answers (its message read by the one conversation codec, warehouse.chat); each tool call it makes is
checked and decoded (`check_call`), run in the episode's sandbox
(in a worker thread: sandboxes are synchronous) and its observation appended as a `tool` message with the
call's `tool_call_id`; an assistant message without tool calls ends the model's turn. A multi-turn task
(Task.later_turns, e.g. BFCL's) then gets its next user message and the loop goes on (`max_turns` holds per user
turn); after the last one it ends the episode and the task's verifier judges it. A BFCL task's tools are its API
functions (Task.tool_specs), each call run in the episode's sandbox by tasks/bfcl.py against the state kept there.

The sandbox is acquired lazily, at the first tool call, and closed when the episode ends: an episode that waits on
a rate-limited endpoint or answers without tools holds no container. A Harbor task's sandbox is a container of the
task's own image (tasks/harbor.py), kept open until its verifier has copied the agent's final state out; an OpenEnv
task's (tasks/openenv.py) is a session of the environment, whose own reward the verifier reads.

Every outcome is a row (never an exception, except cancellation):
- verifier verdict (pass / fail / hack) when the policy gave a final answer;
- `model_error` when the policy raised `ModelError` (context too long, no choice: error_class names it), the
  reply was empty (`EmptyReply`), a tool call was written but cannot be read as one (`MalformedToolCall`: the
  codec's MALFORMED call), or it named an unknown tool / carried arguments that do not decode
  (`ToolArgumentError`). The offending turn stays in the row's messages, so the data shows what the model wrote;
  GRPO's reward judges its episodes with the same `episode_model_error`;
- `timeout` with error_class `MaxTurns` when `max_turns` assistant turns passed without a final answer
  (the model's failure to finish: scored, reward 0);
- `infra_error` when the endpoint failed after its retries (`EndpointError`), the sandbox could not be acquired or
  a tool call died of an infrastructure error, the verifier crashed, or anything unexpected was raised
  (error_class / error_message say what). infra_error rows carry reward 0 and success False but are never scored:
  the rollout runner retries them and queries exclude them (warehouse.record.SCORED_VERDICTS).

Rows carry tokens, turns, tool calls, latency, cost, sampling params, policy name and endpoint, sandbox backend and
image, and per-assistant-turn prompt token ids, completion token ids and logprobs when the policy returns them ([]
for a turn that did not), with the chat template's hash and the model version the policy reports. This module does
not retry, batch or write rows (agents/rollout.py and warehouse/ do).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from concurrent.futures import Executor
from typing import Any

import tasks.tools as task_tools
from agents.policy import EndpointError, ModelError, Policy
from sandbox.result import Backend, Sandbox, SandboxError
from tasks.judge.api import Outcome, extract_answer, verify
from tasks.spec import Task
from tasks.tools import ToolArgumentError, observation, parse_arguments, run_tool, tool_schemas
from warehouse import chat
from warehouse.record import Message, ToolCall, Trajectory, trajectory_id

log = logging.getLogger(__name__)

DEFAULT_SYSTEM = "You are a careful agent. Use the tools to work things out, then give your final answer."
ANSWER_FORMATS: dict[str, str] = {
    "numeric": "End your final message with 'Answer: <number>'.",
}
MAX_ERROR_MESSAGE = 2000


def system_prompt(task: Task) -> str:
    """The system message of an episode: the task's own, else a default plus the verifier's answer format."""
    if task.system:
        return task.system
    fmt = ANSWER_FORMATS.get(task.verifier.kind)
    return f"{DEFAULT_SYSTEM} {fmt}" if fmt else DEFAULT_SYSTEM


def initial_messages(task: Task) -> list[Message]:
    """The opening conversation every policy sees (system, the task's earlier turns, user); training reuses it."""
    earlier = list(task.messages or [])
    return [Message(role="system", content=system_prompt(task)), *earlier, Message(role="user", content=task.prompt)]


class MalformedToolCall(ToolArgumentError):
    """The model wrote a tool-call block that cannot be read as a call (warehouse.chat.MALFORMED)."""


class EmptyReply(ModelError):
    """The model ended its turn with neither content nor tool calls."""


def check_call(call: ToolCall, offered: list[str], specs: list[dict[str, Any]] | tuple = ()) -> dict[str, Any]:
    """The decoded arguments of a model's tool call; MalformedToolCall for a call the model wrote but that cannot
    be read, ToolArgumentError for a tool the task does not offer or arguments that do not decode. `specs`: the
    task's own tools (Task.tool_specs)."""
    if chat.is_malformed(call):
        raise MalformedToolCall(chat.malformed_reason(call))
    if call.function.name not in offered:
        raise ToolArgumentError(f"tool {call.function.name!r} is not offered by this task (offered: {offered})")
    return parse_arguments(call.function.name, call.function.arguments, specs)


def episode_model_error(messages: list[Message], offered: list[str],
                        specs: list[dict[str, Any]] | tuple = ()) -> Exception | None:
    """The first model error in a conversation's assistant turns (an empty turn, a call `check_call` refuses), or
    None: what the loop stops an episode on. GRPO's reward (training.environment) judges its episodes with it."""
    for m in messages:
        if m.role != "assistant":
            continue
        if chat.is_empty(m):
            return EmptyReply("the model replied with neither content nor tool calls")
        for call in m.tool_calls or []:
            try:
                check_call(call, offered, specs)
            except ToolArgumentError as e:
                return e
    return None


class _Episode:
    """Mutable accounting of one episode while it runs."""

    def __init__(self) -> None:
        self.turns = 0
        self.n_tool_calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0
        self.token_ids: list[list[int]] = []
        self.logprobs: list[list[float]] = []
        self.prompt_ids: list[list[int]] = []
        self.any_prompt_ids = False
        self.template_hash: str | None = None
        self.model_version: str | None = None
        self.any_token_ids = False
        self.any_logprobs = False
        self.sandbox: Sandbox | None = None


def needs_workspace(task: Task) -> bool:
    """Whether the verifier judges the agent's files (code tasks), so the loop snapshots the workspace."""
    return task.verifier.kind == "unit_tests" or bool(task.files)


def _snapshot(task: Task, sandbox: Sandbox | None) -> task_tools.WorkspaceSnapshot:
    """The agent's workspace after the last turn (pristine task files when no tool call ever opened a sandbox)."""
    if sandbox is None:
        return task_tools.pristine_snapshot(dict(task.files))
    return task_tools.workspace_snapshot(sandbox)


def _verify(task: Task, messages: list[Message], backend: Backend, workspace: task_tools.WorkspaceSnapshot | None,
            extra: dict[str, Any] | None = None) -> Outcome:
    return verify(task, messages, backend=backend, workspace=workspace, **(extra or {}))


# verifier kinds that judge from the episode's still-open sandbox (the agent's container, the env session)
OPEN_SANDBOX_VERIFIERS = ("harbor", "openenv")


def acquire_sandbox(task: Task, backend: Backend, *, reuse_task_containers: bool = False) -> Sandbox:
    """The episode's sandbox: from `backend`, or for a Harbor task a container of the task's own image (with
    `reuse_task_containers`, one an earlier episode of the image left, reset: tasks/harbor.py acquire), or for a
    BFCL task one whose workspace holds the task's API classes (tasks/bfcl.py). GRPO's environments
    (training/environment.py) open theirs here too."""
    if task.verifier.kind == "harbor":
        from tasks.harbor import acquire

        return acquire(task, backend, reuse=reuse_task_containers)
    if task.verifier.kind == "bfcl":
        from tasks.bfcl import acquire as acquire_bfcl

        return acquire_bfcl(task, backend)
    if task.verifier.kind == "openenv":
        from tasks.openenv import acquire as acquire_env

        return acquire_env(task, backend)
    return backend.acquire()


def run_task_tool(task: Task, sandbox: Sandbox, name: str, args: dict[str, Any], timeout_s: float | None) -> Any:
    """A built-in tool (tasks/tools.py), one of a BFCL task's API functions (tasks/bfcl.py), or an OpenEnv step."""
    if task.verifier.kind == "bfcl":
        from tasks.bfcl import run_call

        return run_call(sandbox, name, args, timeout_s=timeout_s)
    if task.verifier.kind == "openenv":
        from tasks.openenv import run_step

        return run_step(sandbox, args)
    return run_tool(sandbox, name, args, timeout_s=timeout_s)


async def _in_thread(executor: Executor | None, fn: Any, *args: Any) -> Any:
    """Run a blocking sandbox call in `executor` (the rollout's pool, sized to its concurrency) or, without one, in
    the loop's default executor -- which holds only min(32, cpus + 4) threads: too few for many episodes."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(executor, functools.partial(ctx.run, fn, *args))


async def _close(sandbox: Sandbox | None, executor: Executor | None = None) -> None:
    if sandbox is None:
        return
    try:
        await _in_thread(executor, sandbox.close)
    except Exception as e:  # noqa: BLE001 - closing is best effort: the backend reaps what it cannot close
        log.warning("closing sandbox failed: %s: %s", type(e).__name__, e)


async def run_episode(
    task: Task,
    policy: Policy,
    backend: Backend,
    *,
    run_id: str,
    round: int = 0,
    sample_index: int = 0,
    max_turns: int = 8,
    tool_timeout_s: float | None = None,
    verify_kwargs: dict[str, Any] | None = None,
    executor: Executor | None = None,
) -> Trajectory:
    """Run one episode of `task` with `policy`, tool calls in a sandbox from `backend`; return its row.

    max_turns counts assistant messages; exceeding it gives verdict "timeout", error_class "MaxTurns".
    tool_timeout_s overrides the sandbox config's per-call wall-clock limit when given. verify_kwargs go to
    tasks.judge.verify.verify (e.g. rewards=RewardConfig(...), judge_config=JudgeConfig(...)). executor runs the blocking
    sandbox and verifier calls (default: the loop's default executor).
    Never raises for the episode's own failures (see the module docstring); cancellation propagates.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    t0 = time.perf_counter()
    tools: list[dict[str, Any]] = []
    messages = initial_messages(task)
    ep = _Episode()
    verdict: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    outcome: Outcome | None = None

    try:
        tools = tool_schemas(task.tools, task.tool_specs)  # an unknown tool name: a broken task, an infra_error row
        final = False
        later = list(task.later_turns)
        turn_start = 0  # ep.turns when the current user turn began: max_turns holds per user turn
        while ep.turns - turn_start < max_turns:
            try:
                reply = await policy.reply(messages, tools, task=task, sample_index=sample_index)
            except ModelError as e:
                verdict, error_class, error_message = "model_error", type(e).__name__, str(e)
                break
            except EndpointError as e:
                verdict, error_class, error_message = "infra_error", type(e).__name__, str(e)
                break
            ep.turns += 1
            ep.prompt_tokens += reply.prompt_tokens
            ep.completion_tokens += reply.completion_tokens
            ep.cost_usd += reply.cost_usd
            ep.token_ids.append(list(reply.token_ids or []))
            ep.logprobs.append(list(reply.logprobs or []))
            ep.any_token_ids |= reply.token_ids is not None
            ep.any_logprobs |= reply.logprobs is not None
            ep.prompt_ids.append(list(reply.prompt_token_ids or []))
            ep.any_prompt_ids |= reply.prompt_token_ids is not None
            ep.template_hash = reply.chat_template_hash or ep.template_hash
            ep.model_version = reply.model_version or ep.model_version
            msg = reply.message
            if msg.role != "assistant":
                msg = msg.model_copy(update={"role": "assistant"})
            messages.append(msg)
            if chat.is_empty(msg):
                verdict, error_class = "model_error", EmptyReply.__name__
                error_message = (f"the model replied with neither content nor tool calls "
                                 f"(finish_reason={reply.finish_reason!r})")
                break
            if not msg.tool_calls:
                if later:  # the model ended its turn: the next user turn comes (multi-turn tasks)
                    messages.append(Message(role="user", content=later.pop(0)))
                    turn_start = ep.turns
                    continue
                final = True
                break
            stop = False
            for call in msg.tool_calls:
                ep.n_tool_calls += 1
                try:
                    args = check_call(call, list(task.tools), task.tool_specs)
                except ToolArgumentError as e:
                    messages.append(Message(role="tool", tool_call_id=call.id, name=call.function.name,
                                            content=f"error: {e}"))
                    verdict, error_class, error_message = "model_error", type(e).__name__, str(e)
                    stop = True
                    break
                if ep.sandbox is None:
                    try:
                        ep.sandbox = await _in_thread(executor, acquire_sandbox, task, backend)
                        if task.files:
                            await _in_thread(executor, task_tools.prepare_workspace, ep.sandbox, dict(task.files))
                    except Exception as e:  # noqa: BLE001
                        verdict, error_class = "infra_error", type(e).__name__
                        error_message = f"acquiring a sandbox from backend {backend.name!r}: {e}"
                        stop = True
                        break
                sandbox = ep.sandbox
                try:
                    result = await _in_thread(executor, run_task_tool, task, sandbox, call.function.name, args,
                                              tool_timeout_s)
                except SandboxError as e:
                    verdict, error_class, error_message = "infra_error", type(e).__name__, str(e)
                    stop = True
                    break
                if result.verdict == "infra_error":
                    verdict, error_class = "infra_error", "SandboxInfraError"
                    error_message = result.error or "the sandbox reported an infrastructure error"
                    stop = True
                    break
                messages.append(Message(role="tool", tool_call_id=call.id, name=call.function.name,
                                        content=observation(result)))
            if stop:
                break
        if verdict is None and not final:
            verdict, error_class = "timeout", "MaxTurns"
            error_message = f"no final answer after {max_turns} assistant turns (max_turns={max_turns})"
            if task.later_turns:
                error_message += (f" in user turn {len(task.later_turns) - len(later) + 1} of "
                                  f"{len(task.later_turns) + 1}")
        if verdict is None:
            try:
                workspace = None
                if needs_workspace(task):
                    workspace = await _in_thread(executor, _snapshot, task, ep.sandbox)
                extra = verify_kwargs
                if task.verifier.kind in OPEN_SANDBOX_VERIFIERS:
                    extra = {**(verify_kwargs or {}), "agent_sandbox": ep.sandbox}
                outcome = await _in_thread(executor, _verify, task, messages, backend, workspace, extra)
                verdict = outcome.verdict
            except Exception as e:  # noqa: BLE001 - VerifierUnavailable (no backend / judge) or a verifier crash: infrastructure
                verdict, error_class = "infra_error", type(e).__name__
                error_message = f"verifier {task.verifier.kind!r} failed: {type(e).__name__}: {e}"
                outcome = None
    except asyncio.CancelledError:
        await _close(ep.sandbox, executor)
        raise
    except Exception as e:  # anything unexpected is infrastructure, recorded, retried by the runner
        log.exception("episode %s/%s crashed", task.id, sample_index)
        verdict, error_class, error_message = "infra_error", type(e).__name__, str(e) or repr(e)
    await _close(ep.sandbox, executor)

    return episode_row(
        task, messages, tools, run_id=run_id, round=round, sample_index=sample_index, source=policy.source,
        policy=policy.name, endpoint=policy.endpoint, sampling=policy.sampling, verdict=verdict, outcome=outcome,
        error_class=error_class, error_message=error_message,
        sandbox_backend=ep.sandbox.backend if ep.sandbox is not None else backend.name,
        sandbox_image=ep.sandbox.image if ep.sandbox is not None else getattr(backend, "image", None),
        turns=ep.turns, n_tool_calls=ep.n_tool_calls, prompt_tokens=ep.prompt_tokens,
        completion_tokens=ep.completion_tokens, cost_usd=ep.cost_usd, latency_ms=(time.perf_counter() - t0) * 1000.0,
        completion_token_ids=ep.token_ids if ep.any_token_ids else None,
        completion_logprobs=ep.logprobs if ep.any_logprobs else None,
        prompt_token_ids=ep.prompt_ids if ep.any_prompt_ids else None, chat_template_hash=ep.template_hash,
        model_version=ep.model_version)


def episode_row(task: Task, messages: list[Message], tools: list[dict[str, Any]], *, run_id: str, round: int,
                sample_index: int, source: str, policy: str, verdict: str, outcome: Outcome | None = None,
                endpoint: str | None = None, sampling: dict[str, Any] | None = None, error_class: str | None = None,
                error_message: str | None = None, sandbox_backend: str | None = None,
                sandbox_image: str | None = None, turns: int = 0, n_tool_calls: int = 0, prompt_tokens: int = 0,
                completion_tokens: int = 0, cost_usd: float = 0.0, latency_ms: float = 0.0,
                completion_token_ids: list[list[int]] | None = None,
                completion_logprobs: list[list[float]] | None = None,
                prompt_token_ids: list[list[int]] | None = None, chat_template_hash: str | None = None,
                stage: str = "rollout",
                grpo_step: int | None = None, group_id: str | None = None, advantage: float | None = None,
                reward: float | None = None, model_version: str | None = None) -> Trajectory:
    """The one row builder of an episode: the loop's (`run_episode`) and GRPO's (training.environment).

    The id is warehouse.record.trajectory_id of (run, round, task, policy, sample index[, stage, grpo step]).
    Reward and success come from `outcome` when its verdict is the row's verdict (a scored final answer), else
    0 / False; `reward` overrides the reward (GRPO's: a hack scores 0 whatever the verifier said).
    """
    scored = outcome is not None and verdict == outcome.verdict
    return Trajectory(
        trajectory_id=trajectory_id(run_id, round, task.id, policy, sample_index, stage=stage, grpo_step=grpo_step),
        run_id=run_id,
        round=round,
        source=source,  # type: ignore[arg-type]
        policy=policy,
        endpoint=endpoint,
        sampling_json=json.dumps(sampling or {}, sort_keys=True, default=str),
        sample_index=sample_index,
        task_id=task.id,
        suite=task.suite,
        split=task.split,
        task_version=task.version,
        difficulty=task.difficulty,
        sandbox_backend=sandbox_backend,
        sandbox_image=sandbox_image,
        verifier=outcome.verifier if outcome else task.verifier.kind,
        verifier_version=outcome.verifier_version if outcome else "",
        verifier_strength=outcome.verifier_strength if outcome else None,
        messages=messages,
        tools_json=json.dumps(tools),  # as offered: key order is part of the prompt the model saw
        answer=outcome.answer if outcome else extract_answer(messages),
        reward=reward if reward is not None else (outcome.reward if scored and outcome else 0.0),
        success=bool(outcome.success) if scored and outcome else False,
        verdict=verdict,  # type: ignore[arg-type]
        hack_flags=list(outcome.hack_flags) if outcome else [],
        reward_terms_json=json.dumps(outcome.reward_terms if outcome else {}, sort_keys=True),
        verifier_details_json=json.dumps(outcome.details if outcome else {}, sort_keys=True, default=str),
        turns=turns,
        n_tool_calls=n_tool_calls,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=cost_usd,
        latency_ms=latency_ms,
        completion_token_ids=completion_token_ids,
        completion_logprobs=completion_logprobs,
        prompt_token_ids=prompt_token_ids,
        chat_template_hash=chat_template_hash,
        model_version=model_version,
        stage=stage,  # type: ignore[arg-type]
        grpo_step=grpo_step,
        group_id=group_id,
        advantage=advantage,
        error_class=error_class,
        error_message=(error_message or "")[:MAX_ERROR_MESSAGE] or None,
    )
