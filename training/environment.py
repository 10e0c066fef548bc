"""The GRPO environment adapter: our tasks' tools, sandboxes, verifiers and forensics behind TRL's environment API.

TRL's GRPOTrainer (`environment_factory=`) creates one environment object per rollout, calls `reset(**row)` with
the dataset row, exposes the object's public methods as tools (schemas from type hints and Google docstrings) and
calls them when the model emits tool calls. Here:

- `environment_class(tool_names, specs=...)` builds a class whose methods are exactly the task's tools: the
  built-in ones generated from tasks.tools.TOOLS with typed signatures (`check_schemas` proves TRL derives the loop's
  schema from each), a task's own (BFCL's functions) as pass-through methods. `show_task_schemas(trainer)` then
  hands TRL the loop's own schemas, in the task's order, to render: the GRPO prompt is the one the episode loop
  (and therefore SFT) shows the model.
- A method runs the call in the episode's sandbox, acquired lazily as the loop does (agents.loop.acquire_sandbox:
  from the shared backend, or for a Harbor task a fresh container of the task's own image), through the loop's
  agents.loop.run_task_tool, and returns tasks.tools.observation: the model sees what it would see in the loop.
- `use_codec_parser(tokenizer)` makes TRL read every generation with the one conversation codec
  (agents.transformers_policy.completion_text, then warehouse.chat.parse_text in the template's dialect, Hermes or
  GPT-OSS harmony): the calls GRPO runs and the
  messages it scores are the ones the episode loop would store for the same text. A malformed `<tool_call>` block
  stays a MALFORMED call (TRL answers it with a tool error and the turn is kept), never a silently plain turn.
- `EpisodeReward` is the reward function: it rebuilds the episode's messages (system + user + completion turns,
  `completion_messages`, through warehouse.chat.from_chat), judges them as the loop does: the first model error
  (`agents.loop.episode_model_error`: an empty turn, a malformed call, an unknown tool, arguments that do not
  decode) is a `model_error` scoring 0; otherwise tasks.judge.verify.verify (outcome, forensics, reward terms) with
  what the loop gives it (the workspace of a code task; the agent's open container for a Harbor task, whose grader
  runs in a fresh container of the image). Then it closes the sandbox. A hack scores 0 whatever else it did; an
  infrastructure failure scores None (TRL leaves it out) and is counted, never 0.
  With `strengths` set (GRPOConfig.reward_strengths), a verdict reached on another path (an `isolated` test run
  when only `data` is trusted) scores None too, counted as `weak_verdict`. It keeps the batch's episodes
  (`last_episodes`, `ScoredEpisode`), which `grpo_rows` turns into lake rows with TRL's advantages, through the
  episode loop's row builder (agents.loop.episode_row).

This module does not start training (grpo.py) or choose tasks.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from agents.loop import (
    OPEN_SANDBOX_VERIFIERS,
    acquire_sandbox,
    episode_model_error,
    episode_row,
    needs_workspace,
    run_task_tool,
)
from agents.transformers_policy import completion_text
from sandbox.result import Backend, Sandbox, SandboxError
from tasks.spec import Task
from tasks.tools import observation, tool_schemas
from warehouse import chat
from warehouse.record import Message, Trajectory

log = logging.getLogger(__name__)

_JSON_TO_PY = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


class EnvironmentError_(RuntimeError):
    """The environment cannot reproduce the loop's prompt for these tools (schema mismatch, unknown tool)."""


class SandboxEnvironment:
    """Base of generated environments: one task, one lazily acquired sandbox, the episode's tool calls."""

    backend: Backend | None = None  # set on the generated subclass
    tool_timeout_s: float | None = None
    reuse_task_containers = False  # a Harbor task's agent container reset and reused between generations

    def __init__(self) -> None:
        self.task: Task | None = None
        self.later: list[str] = []
        self.sandbox: Sandbox | None = None
        self.n_tool_calls = 0
        self.infra_error: str | None = None
        self._lock = threading.Lock()

    def reset(self, **row: Any) -> None:
        """Start an episode of the task in row['task_json']; the prompt already holds the user message. `later` holds
        the task's later user turns (BFCL's), which GRPO's trainer delivers after each reply without a call."""
        self._close()
        self.task = Task.model_validate_json(row["task_json"])
        self.later = list(self.task.later_turns)
        self.n_tool_calls = 0
        self.infra_error = None

    def _call(self, name: str, args: dict[str, Any]) -> str:
        self.n_tool_calls += 1
        if self.backend is None:
            raise EnvironmentError_("environment has no sandbox backend; build it with environment_class(...)")
        try:
            if self.sandbox is None:
                self.sandbox = acquire_sandbox(self.task, self.backend,
                                               reuse_task_containers=self.reuse_task_containers)
                if self.task.files:
                    from tasks.tools import prepare_workspace

                    prepare_workspace(self.sandbox, dict(self.task.files))
            result = run_task_tool(self.task, self.sandbox, name, args, self.tool_timeout_s)
        except SandboxError as e:
            self.infra_error = f"{type(e).__name__}: {e}"
            raise
        if result.verdict == "infra_error":
            self.infra_error = result.error or "infra_error"
        return observation(result)

    def _workspace(self) -> Any:
        from tasks import tools as task_tools

        if self.sandbox is None:
            return task_tools.pristine_snapshot(dict(self.task.files) if self.task is not None else {})
        return task_tools.workspace_snapshot(self.sandbox)

    def _close(self) -> None:
        sb, self.sandbox = self.sandbox, None
        if sb is not None:
            try:
                sb.close()
            except Exception as e:  # closing is best effort: the backend reaps what it cannot close  # noqa: BLE001
                log.warning("closing sandbox failed: %s: %s", type(e).__name__, e)


def _method_source(schema: dict[str, Any]) -> str:
    fn = schema["function"]
    name = fn["name"]
    props = fn["parameters"].get("properties", {})
    required = fn["parameters"].get("required", [])
    if not name.isidentifier():
        raise EnvironmentError_(f"tool name {name!r} is not a Python identifier")
    params, arg_doc = [], []
    for p, spec in props.items():
        py = _JSON_TO_PY.get(spec.get("type", "string"))
        if py is None or not p.isidentifier():
            raise EnvironmentError_(f"tool {name!r} parameter {p!r} of type {spec.get('type')!r} is not supported")
        params.append(f"{p}: {py}" if p in required else f"{p}: {py} | None = None")
        arg_doc.append(f"            {p}: {spec.get('description', p)}")
    doc = fn.get("description", name)
    if arg_doc:
        doc += "\n\n        Args:\n" + "\n".join(arg_doc) + "\n        "
    call_args = ", ".join(f"{p!r}: {p}" for p in props)
    sig = ", ".join(["self", *params])
    return (f"def {name}({sig}):\n"
            f"    {json.dumps(doc)}\n"  # a JSON string is a valid Python string literal here
            f"    args = {{{call_args}}}\n"
            f"    return self._call({name!r}, {{k: v for k, v in args.items() if v is not None}})\n")


def _tool_methods(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """One method per tool schema, each calling `self._call(name, args)`, with the docstring TRL reads back."""
    methods: dict[str, Any] = {}
    for schema in schemas:
        ns: dict[str, Any] = {}
        exec(_method_source(schema), ns)  # noqa: S102 - source generated from tool schemas, names checked
        fn = ns[schema["function"]["name"]]
        fn.__doc__ = schema["function"]["description"] + _args_doc(schema)
        methods[fn.__name__] = fn
    return methods


def _passthrough_method(name: str) -> Any:
    """A tool method for a task's own tool (Task.tool_specs, BFCL's functions): the call's arguments as they came;
    the task's schema is what the prompt shows (show_task_schemas) and the loop's check judges the call."""

    def method(self: SandboxEnvironment, **kwargs: Any) -> str:
        return self._call(name, kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def environment_class(tool_names: list[str], backend: Backend, *, specs: list[dict[str, Any]] | tuple = (),
                      tool_timeout_s: float | None = None, reuse_task_containers: bool = False) -> type:
    """A SandboxEnvironment subclass whose public methods are exactly `tool_names`: the built-in tools' (tasks.tools
    schemas, typed so TRL derives the same schema) and a task's own tools from `specs` (BFCL's); `schemas` holds
    the schemas the episode loop shows, in the task's order, which GRPO renders (show_task_schemas). With
    `reuse_task_containers` a Harbor task's generations share reset containers of its image (grpo.harbor_reuse)."""
    schemas = tool_schemas(tool_names, specs)
    own = {s["function"]["name"] for s in specs}
    builtin = [n for n in tool_names if n not in own]
    methods: dict[str, Any] = {"backend": backend, "tool_timeout_s": tool_timeout_s, "schemas": schemas,
                               "reuse_task_containers": reuse_task_containers,
                               **_tool_methods(tool_schemas(builtin)),
                               **{n: _passthrough_method(n) for n in tool_names if n in own}}
    cls = type("SandboxEnvironment_" + "_".join(tool_names), (SandboxEnvironment,), methods)
    check_schemas(cls, builtin)
    return cls


class OpenEnvEpisode:
    """Base of TRL environments that play a suite served over OpenEnv (`flywheel env serve`, tasks/openenv.py),
    through openenv's own client: `reset(**row)` opens the session on the row's task, each tool method is one step
    (the call runs in the server's sandbox), and `_finish(final)` sends the closing turn, on which the server's judge
    answers with the reward and the verdict. The row of every episode is the server's; the text a turn writes beside
    its tool call is not in it (TRL hands a tool method the call's arguments only)."""

    base_url: str = ""  # set on the generated subclass
    policy: str = "trl"

    def __init__(self) -> None:
        self.client: Any = None
        self.done = False
        self.reward: float | None = None
        self.verdict: str | None = None
        self.hack_flags: list[str] = []

    def reset(self, **row: Any) -> None:
        """Open a session on the task in row['task_id']; the prompt already holds the opening messages."""
        from tasks.openenv import EpisodeClient

        if self.client is None:
            self.client = EpisodeClient(self.base_url)
        self.client.reset(task_id=row["task_id"], policy=self.policy)
        self.done, self.reward, self.verdict, self.hack_flags = False, None, None, []

    def _end(self, obs: dict[str, Any], reward: float | None) -> None:
        self.done, self.verdict, self.hack_flags = True, obs.get("verdict"), list(obs.get("hack_flags") or [])
        self.reward = None if self.verdict == "infra_error" else float(reward or 0.0)  # infra: left out, never 0

    def _call(self, name: str, args: dict[str, Any]) -> str:
        if self.done:
            return f"error: the episode is over ({self.verdict})"
        obs, reward, done = self.client.step({"tool_calls": [{"name": name, "arguments": args}]})
        if done:  # the server's loop ended the episode on this call (a model error, the turn limit)
            self._end(obs, reward)
            return f"error: {obs.get('error') or 'the episode is over'}"
        return "\n".join(m.get("content") or "" for m in obs.get("messages") or [] if m.get("role") == "tool")

    def _finish(self, final: str) -> float | None:
        """Send the closing turn (no tool call) unless the episode already ended; the judge's reward."""
        if not self.done:
            obs, reward, _ = self.client.step({"content": final})
            self._end(obs, reward)
        return self.reward

    def _close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()


def openenv_environment_class(base_url: str, tools: list[dict[str, Any]], *, policy: str = "trl") -> type:
    """An OpenEnvEpisode subclass for TRL's `environment_factory`, whose public methods are the served suite's tools
    (`tools`: the schemas its reset returns)."""
    return type("OpenEnvEpisode_" + "_".join(t["function"]["name"] for t in tools), (OpenEnvEpisode,),
                {"base_url": base_url.rstrip("/"), "policy": policy, **_tool_methods(tools)})


def openenv_task_rows(base_url: str, n: int) -> tuple[dict[str, list], list[dict[str, Any]]]:
    """GRPO dataset columns for n tasks of a served suite (reset seeds 0..n-1: prompt, task_id) and its tools."""
    from tasks.openenv import EpisodeClient

    client = EpisodeClient(base_url)
    prompts, ids, tools = [], [], []
    try:
        for i in range(n):
            obs, _, _ = client.reset(seed=i)
            prompts.append(obs["messages"])
            ids.append(obs["task_id"])
            tools = tools or obs["tools"]
    finally:
        client.close()
    return {"prompt": prompts, "task_id": ids}, tools


class OpenEnvReward:
    """TRL reward function of OpenEnvEpisode environments: each rollout's last assistant text is the closing turn;
    the reward is the served judge's (a hack scores 0 there; an infrastructure failure is None, left out)."""

    __name__ = "openenv"

    def __call__(self, prompts: list, completions: list, environments: list | None = None, **kw: Any) -> list:
        if environments is None:
            raise EnvironmentError_("OpenEnvReward needs TRL environments (environment_factory=OpenEnvEpisode...)")
        out = []
        for completion, env in zip(completions, environments, strict=True):
            turns = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            final = next((t.get("content") or "" for t in reversed(turns) if t.get("role") == "assistant"), "")
            out.append(env._finish(final if isinstance(final, str) else json.dumps(final)))
        return out


def _args_doc(schema: dict[str, Any]) -> str:
    props = schema["function"]["parameters"].get("properties", {})
    if not props:
        return ""
    return "\n\nArgs:\n" + "\n".join(f"    {p}: {s.get('description', p)}" for p, s in props.items())


def check_schemas(cls: type, tool_names: list[str]) -> None:
    """Raise EnvironmentError_ unless TRL derives exactly tasks.tools' schemas from the class's methods."""
    from transformers.utils.chat_template_utils import get_json_schema

    for schema in tool_schemas(tool_names):
        name = schema["function"]["name"]
        got = get_json_schema(getattr(cls, name))
        if json.dumps(got) != json.dumps(schema):
            raise EnvironmentError_(f"tool {name!r}: TRL would show the model {json.dumps(got)} but the episode loop "
                                    f"shows {json.dumps(schema)}; the GRPO prompt would differ from SFT's. Fix the "
                                    f"schema in tasks/tools.py to one a docstring can express.")


def show_task_schemas(trainer: Any) -> None:
    """Make GRPO's prompt show each environment's tools exactly as the episode loop (and so SFT) shows them.

    TRL (1.16) renders an environment's tools from its methods, listed with inspect.getmembers, alphabetically: for
    a task with several tools (Harbor's shell, read_file, write_file; the code suite's four) the prompt would list
    them in another order than the one SFT trained on, and a task's own tools (BFCL's) would show whatever schema a
    method's signature gives. This hands TRL the loop's schemas (the class's `schemas`, in the task's order) to
    render; TRL still calls the methods, by name. EnvironmentError_ when TRL's methods are not those tools."""
    for name, pool in trainer._environment_pool.items():
        schemas = getattr(type(pool[0]), "schemas", None)
        if schemas is None:
            continue
        methods = sorted(getattr(m, "__name__", None) for m in trainer._env_tools[name])
        if methods != sorted(s["function"]["name"] for s in schemas):
            raise EnvironmentError_(f"TRL exposes tools {methods} for environment {name!r}, the task has "
                                    f"{[s['function']['name'] for s in schemas]}")
        trainer._env_tools[name] = list(schemas)


def trl_turn(message: Message) -> dict[str, Any]:
    """An assistant Message as TRL's parsed response: arguments decoded when they are a JSON object (TRL calls the
    tool with them as keywords), else the raw string (TRL answers that call with a tool error)."""
    d: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        calls = []
        for c in message.tool_calls:
            try:
                args: Any = json.loads(c.function.arguments)
            except json.JSONDecodeError:
                args = c.function.arguments
            calls.append({"type": "function", "function": {
                "name": c.function.name, "arguments": args if isinstance(args, dict) else c.function.arguments}})
        d["tool_calls"] = calls
    return d


def use_codec_parser(tokenizer: Any) -> Any:
    """Make TRL parse GRPO's generations with the one conversation codec; returns the tokenizer.

    TRL reads each generation with `tokenizer.parse_response(ids, ...)` once the tokenizer has a response template
    (TRL's `add_response_schema` sets one for the chat templates it knows); this instance's parse_response becomes
    completion_text + warehouse.chat.parse_text + trl_turn. EnvironmentError_ when TRL knows no response template
    for the model's chat template (it would then never parse a tool call at all)."""
    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        raise EnvironmentError_("TRL knows no response template for this model's chat template, so GRPO would never "
                                "see a tool call; use a Hermes/Qwen-style chat template (training.tiny's)")

    dialect = chat.dialect_of(tokenizer.chat_template)

    def parse_response(ids: Any, prefix: Any = None, tools: Any = None) -> dict[str, Any]:
        return trl_turn(chat.parse_text(completion_text(tokenizer, list(ids)), turn=0, dialect=dialect))

    tokenizer.parse_response = parse_response
    return tokenizer


def completion_messages(completion: list[dict[str, Any]], *, start: int = 0) -> list[Message]:
    """TRL's completion turns (assistant dicts, tool dicts) -> our Messages through warehouse.chat.from_chat, the
    assistant at conversation position `start + k` getting call ids `call_{start + k}_{j}` as the loop gives them;
    each tool message answers the next pending call of the assistant turn before it."""
    out: list[Message] = []
    pending: list[str] = []
    for k, m in enumerate(completion):
        msg = chat.from_chat(m, turn=start + k)  # TRL's turns carry no call ids: positional ones
        if msg.role == "assistant":
            pending = [c.id for c in msg.tool_calls or []]
        elif msg.role == "tool":
            msg = msg.model_copy(update={"tool_call_id": pending.pop(0) if pending else None})
        out.append(msg)
    return out


@dataclass
class ScoredEpisode:
    """One GRPO generation as the reward function judged it: what `grpo_rows` turns into a lake row."""

    task: Task
    messages: list[Message]
    verdict: str
    reward: float | None = None  # what TRL got: None = left out (infra, untrusted strength)
    outcome: Any = None  # tasks.judge.verify.Outcome when the verifier ran
    error_class: str | None = None
    error_message: str | None = None
    sandbox_backend: str | None = None
    sandbox_image: str | None = None
    n_tool_calls: int = 0
    turns: int = 0


class EpisodeReward:
    """TRL reward function: verify + forensics on the rebuilt episode; hack -> 0; infra failure -> None.

    Keeps counts (`stats`), the last batch's verdicts (`last_verdicts`) for diagnostics and tests, and the last
    batch's episodes (`last_episodes`, in TRL's batch order) for the rows GRPO writes (`grpo_rows`).
    """

    __name__ = "verifier"

    def __init__(self, backend: Backend | None = None, rewards: Any = None,
                 strengths: tuple[str, ...] | None = None) -> None:
        self.backend = backend
        self.rewards = rewards
        self.strengths = strengths  # verdict strengths whose reward counts; None: every strength
        self.stats = {"episodes": 0, "pass": 0, "fail": 0, "hack": 0, "model_error": 0, "infra": 0,
                      "hack_positive": 0, "weak_verdict": 0}
        self.last_verdicts: list[str] = []
        self.last_episodes: list[ScoredEpisode] = []
        self.history: list[dict[str, Any]] = []

    def __call__(self, prompts: list, completions: list, environments: list | None = None, **kw: Any) -> list:
        if environments is None:
            raise EnvironmentError_("EpisodeReward needs TRL environments (pass environment_factory to GRPOTrainer)")
        self.last_verdicts = []
        self.last_episodes = []
        for prompt, completion, env in zip(prompts, completions, environments, strict=True):
            msgs = [chat.from_chat(m, turn=i) for i, m in enumerate(prompt)]
            msgs += completion_messages(completion if isinstance(completion, list) else
                                        [{"role": "assistant", "content": completion}], start=len(msgs))
            sb = env.sandbox
            ep = self._score(env, msgs)
            ep.sandbox_backend = sb.backend if sb is not None else getattr(self.backend, "name", None)
            ep.sandbox_image = sb.image if sb is not None else getattr(self.backend, "image", None)
            ep.n_tool_calls = env.n_tool_calls
            ep.turns = sum(1 for m in msgs if m.role == "assistant")
            env._close()
            self.last_verdicts.append("weak_verdict" if ep.error_class == "WeakVerdict" else ep.verdict)
            self.last_episodes.append(ep)
        return [ep.reward for ep in self.last_episodes]

    def _score(self, env: Any, msgs: list[Message]) -> ScoredEpisode:
        """Judge one rebuilt episode (the sandbox is still open: a code task's workspace is read from it)."""
        from tasks.judge.api import verify

        self.stats["episodes"] += 1
        task: Task = env.task
        if env.infra_error:
            self.stats["infra"] += 1
            return ScoredEpisode(task, msgs, "infra_error", None, error_class="SandboxInfraError",
                                 error_message=env.infra_error)
        err = episode_model_error(msgs, list(task.tools), task.tool_specs)
        if err is not None:
            self.stats["model_error"] += 1
            self.history.append({"task_id": task.id, "verdict": "model_error", "reward": 0.0, "hack_flags": []})
            return ScoredEpisode(task, msgs, "model_error", 0.0, error_class=type(err).__name__,
                                 error_message=str(err))
        try:
            kwargs: dict[str, Any] = {"backend": self.backend}
            if needs_workspace(task):
                kwargs["workspace"] = env._workspace()
            if task.verifier.kind in OPEN_SANDBOX_VERIFIERS:  # a Harbor task: graded from the agent's container
                kwargs["agent_sandbox"] = env.sandbox
            if self.rewards is not None:
                kwargs["rewards"] = self.rewards
            outcome = verify(task, msgs, **kwargs)
        except Exception as e:  # the verifier's infrastructure failed: never a 0 for the model  # noqa: BLE001
            log.warning("verifier failed on %s: %s: %s", task.id, type(e).__name__, e)
            self.stats["infra"] += 1
            return ScoredEpisode(task, msgs, "infra_error", None, error_class=type(e).__name__,
                                 error_message=f"verifier {task.verifier.kind!r} failed: {type(e).__name__}: {e}")
        verdict = "hack" if outcome.hack_flags else outcome.verdict
        reward = 0.0 if (outcome.verdict == "hack" or outcome.hack_flags) else float(outcome.reward)
        if self.strengths is not None and outcome.verifier_strength not in self.strengths:
            self.stats["weak_verdict"] += 1  # judged by a path the config does not trust for rewards: left out
            return ScoredEpisode(task, msgs, verdict, None, outcome=outcome, error_class="WeakVerdict",
                                 error_message=f"judged at strength {outcome.verifier_strength!r}; "
                                               f"grpo.reward_strengths trusts only {list(self.strengths)}: "
                                               "left out of GRPO's reward")
        self.stats[verdict if verdict in ("pass", "fail", "hack") else "fail"] += 1
        if verdict == "hack" and outcome.reward > 0:
            self.stats["hack_positive"] += 1  # verify gave a hack a positive reward: we still score it 0
        self.history.append({"task_id": task.id, "verdict": verdict, "reward": reward,
                             "hack_flags": list(outcome.hack_flags)})
        return ScoredEpisode(task, msgs, verdict, reward, outcome=outcome)


def grpo_rows(episodes: list[ScoredEpisode], advantages: list[float], *, step: int, num_generations: int,
              run_id: str, round: int, policy: str, sampling: dict[str, Any],
              model_version: str | None = None) -> list[Trajectory]:
    """One generation batch of GRPO as lake rows (agents.loop.episode_row, the loop's row builder): source
    student, stage grpo, `grpo_step` = optimizer steps taken before the batch was generated, `group_id` per
    prompt's `num_generations` consecutive generations (TRL's grouping), `advantage` exactly as TRL computed it
    (0 for a generation left out of the reward), reward what TRL got (a hack 0; where TRL got None, the row's own:
    infra_error rows are never scored, a verdict at an untrusted strength says so in error_class WeakVerdict).
    The sample index is the position in the step's batch, and the id's key holds the step, so a seeded re-run of
    the same training writes the same ids (the lake skips them)."""
    if len(episodes) != len(advantages):
        raise ValueError(f"{len(episodes)} scored episodes but {len(advantages)} advantages in GRPO step {step}")
    return [
        episode_row(
            ep.task, ep.messages, tool_schemas(list(ep.task.tools), ep.task.tool_specs), run_id=run_id, round=round,
            sample_index=i,
            source="student", policy=policy, sampling=sampling, verdict=ep.verdict, outcome=ep.outcome,
            reward=ep.reward if ep.reward is not None else (0.0 if ep.verdict == "hack" else None),
            error_class=ep.error_class,
            error_message=ep.error_message, sandbox_backend=ep.sandbox_backend, sandbox_image=ep.sandbox_image,
            turns=ep.turns, n_tool_calls=ep.n_tool_calls, stage="grpo", grpo_step=step,
            group_id=f"{run_id}-r{round}-s{step}-g{i // num_generations}", advantage=float(adv),
            model_version=model_version)
        for i, (ep, adv) in enumerate(zip(episodes, advantages, strict=True))]
