"""The GRPO environment adapter: our tasks' tools, sandboxes, verifiers and forensics behind TRL's environment API.

TRL's GRPOTrainer (`environment_factory=`) creates one environment object per rollout, calls `reset(**row)` with
the dataset row, exposes the object's public methods as tools (schemas from type hints and Google docstrings) and
calls them when the model emits tool calls. Here:

- `environment_class(tool_names)` builds a class whose methods are exactly the task's tools, generated from
  tasks.tools.TOOLS so that the schema TRL renders is byte-identical to the one the episode loop (and therefore
  SFT) shows the model; `check_schemas` proves it and raises otherwise.
- A method runs the call in the episode's sandbox (acquired lazily from the shared backend, as the loop does)
  through tasks.tools.run_tool and returns tasks.tools.observation: the model sees what it would see in the loop.
- `EpisodeReward` is the reward function: it rebuilds the episode's messages (system + user + completion turns),
  judges them with tasks.verify.verify (outcome, forensics, reward terms), and closes the sandbox. A hack scores 0
  whatever else it did; an infrastructure failure scores None (TRL leaves it out) and is counted, never 0. A turn
  whose text holds a `<tool_call>` block TRL could not parse (bad JSON) is a `model_error` scoring 0, as the episode
  loop judges it -- not a `no_tool_use` hack, which is what the verifier would see in a call that never ran.
  With `strengths` set (GRPOConfig.reward_strengths), a verdict reached on another path (an `isolated` test run
  when only `data` is trusted) scores None too, counted as `weak_verdict`.

This module does not start training (grpo.py) or choose tasks.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from sandbox.result import Backend, Sandbox, SandboxError
from tasks.spec import Task
from tasks.tools import observation, run_tool, tool_schemas
from warehouse.record import FunctionCall, Message, ToolCall

log = logging.getLogger(__name__)

_JSON_TO_PY = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


class EnvironmentError_(RuntimeError):
    """The environment cannot reproduce the loop's prompt for these tools (schema mismatch, unknown tool)."""


class SandboxEnvironment:
    """Base of generated environments: one task, one lazily acquired sandbox, the episode's tool calls."""

    backend: Backend | None = None  # set on the generated subclass
    tool_timeout_s: float | None = None

    def __init__(self) -> None:
        self.task: Task | None = None
        self.sandbox: Sandbox | None = None
        self.n_tool_calls = 0
        self.infra_error: str | None = None
        self._lock = threading.Lock()

    def reset(self, **row: Any) -> None:
        """Start an episode of the task in row['task_json']; the prompt already holds the user message."""
        self._close()
        self.task = Task.model_validate_json(row["task_json"])
        self.n_tool_calls = 0
        self.infra_error = None

    def _call(self, name: str, args: dict[str, Any]) -> str:
        self.n_tool_calls += 1
        if self.backend is None:
            raise EnvironmentError_("environment has no sandbox backend; build it with environment_class(...)")
        try:
            if self.sandbox is None:
                self.sandbox = self.backend.acquire()
                files = dict(self.task.files) if self.task is not None else {}
                if files:
                    from tasks.tools import prepare_workspace

                    prepare_workspace(self.sandbox, files)
            result = run_tool(self.sandbox, name, args, timeout_s=self.tool_timeout_s)
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


def environment_class(tool_names: list[str], backend: Backend, *, tool_timeout_s: float | None = None) -> type:
    """A SandboxEnvironment subclass whose public methods are exactly `tool_names` (tasks.tools schemas)."""
    methods: dict[str, Any] = {"backend": backend, "tool_timeout_s": tool_timeout_s}
    for schema in tool_schemas(tool_names):
        ns: dict[str, Any] = {}
        exec(_method_source(schema), ns)  # noqa: S102 - source generated from our own tool schemas
        fn = ns[schema["function"]["name"]]
        fn.__doc__ = schema["function"]["description"] + _args_doc(schema)
        methods[fn.__name__] = fn
    cls = type("SandboxEnvironment_" + "_".join(tool_names), (SandboxEnvironment,), methods)
    check_schemas(cls, tool_names)
    return cls


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


def completion_messages(completion: list[dict[str, Any]]) -> list[Message]:
    """TRL's completion turns (assistant dicts with parsed tool calls, tool dicts) -> our Message models."""
    out: list[Message] = []
    pending: list[str] = []
    for k, m in enumerate(completion):
        role = m.get("role")
        if role == "assistant":
            calls = []
            for j, tc in enumerate(m.get("tool_calls") or []):
                fn = tc.get("function", tc)
                args = fn.get("arguments", {})
                calls.append(ToolCall(id=f"call_{k}_{j}", function=FunctionCall(
                    name=str(fn.get("name")), arguments=args if isinstance(args, str) else json.dumps(args))))
            pending = [c.id for c in calls]
            content = m.get("content")
            out.append(Message(role="assistant", content=content if isinstance(content, str) and content else None,
                               tool_calls=calls or None))
        elif role == "tool":
            cid = pending.pop(0) if pending else None
            content = m.get("content")
            out.append(Message(role="tool", name=m.get("name"), tool_call_id=cid,
                               content=content if isinstance(content, str) else json.dumps(content)))
    return out


def unparsed_tool_call(completion: list[dict[str, Any]]) -> bool:
    """True when an assistant turn carries tool-call text but no parsed tool call (TRL found no valid JSON)."""
    return any(m.get("role") == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str)
               and "<tool_call>" in m["content"] for m in completion)


class EpisodeReward:
    """TRL reward function: verify + forensics on the rebuilt episode; hack -> 0; infra failure -> None.

    Keeps counts (`stats`) and the last batch's verdicts (`last_verdicts`) for diagnostics and tests.
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
        self.history: list[dict[str, Any]] = []

    def __call__(self, prompts: list, completions: list, environments: list | None = None, **kw: Any) -> list:
        from tasks.verify import verify

        if environments is None:
            raise EnvironmentError_("EpisodeReward needs TRL environments (pass environment_factory to GRPOTrainer)")
        rewards: list[float | None] = []
        self.last_verdicts = []
        for prompt, completion, env in zip(prompts, completions, environments, strict=True):
            self.stats["episodes"] += 1
            task: Task = env.task
            msgs = [Message(role=m["role"], content=m["content"]) for m in prompt]
            msgs += completion_messages(completion if isinstance(completion, list) else
                                        [{"role": "assistant", "content": completion}])
            if env.infra_error:
                self.stats["infra"] += 1
                self.last_verdicts.append("infra_error")
                rewards.append(None)
                env._close()
                continue
            if isinstance(completion, list) and unparsed_tool_call(completion):
                self.stats["model_error"] += 1
                self.last_verdicts.append("model_error")
                self.history.append({"task_id": task.id, "verdict": "model_error", "reward": 0.0, "hack_flags": []})
                rewards.append(0.0)
                env._close()
                continue
            try:
                kwargs: dict[str, Any] = {"backend": self.backend}
                if task.verifier.kind == "unit_tests":
                    kwargs["workspace"] = env._workspace()
                if self.rewards is not None:
                    kwargs["rewards"] = self.rewards
                outcome = verify(task, msgs, **kwargs)
            except Exception as e:  # the verifier's infrastructure failed: never a 0 for the model  # noqa: BLE001
                log.warning("verifier failed on %s: %s: %s", task.id, type(e).__name__, e)
                self.stats["infra"] += 1
                self.last_verdicts.append("infra_error")
                rewards.append(None)
                env._close()
                continue
            env._close()
            if self.strengths is not None and outcome.verifier_strength not in self.strengths:
                self.stats["weak_verdict"] += 1  # judged by a path the config does not trust for rewards: left out
                self.last_verdicts.append("weak_verdict")
                rewards.append(None)
                continue
            reward = 0.0 if (outcome.verdict == "hack" or outcome.hack_flags) else float(outcome.reward)
            verdict = "hack" if outcome.hack_flags else outcome.verdict
            self.stats[verdict if verdict in ("pass", "fail", "hack") else "fail"] += 1
            if verdict == "hack" and outcome.reward > 0:
                self.stats["hack_positive"] += 1  # verify gave a hack a positive reward: we still score it 0
            self.last_verdicts.append(verdict)
            self.history.append({"task_id": task.id, "verdict": verdict, "reward": reward,
                                 "hack_flags": list(outcome.hack_flags)})
            rewards.append(reward)
        return rewards
