"""OpenEnv in and out: the one module that speaks the `openenv-core` package's API (pinned: OPENENV_CORE).

Out, a suite served as an OpenEnv environment (`flywheel env serve`, agents/env_server.py): `create_server_app`
builds the server with openenv-core's own `create_app` around an `Environment` whose reset and step hand over to an
episode session (agents/env_server.py: the episode loop, the judge, the lake). The wire types are `EnvAction` (one
assistant turn: content, reasoning, tool calls, optionally the engine's token ids and logprobs) and
`EnvObservation` (the conversation's new messages, the tools on reset, and at the end the judge's verdict, hack
reason codes, verifier strength and trajectory id). Those end fields are declared fields, and in `metadata` too:
openenv-core 0.3.0's serializer drops `Observation.metadata` on the wire (it keeps it for in-process callers).
Multi-turn episodes go over openenv's WebSocket session (`/ws`); its HTTP /reset and /step are stateless.

In, an OpenEnv environment as a suite (`--suite openenv:http://127.0.0.1:PORT`): `load_openenv` makes one task per
seed (train seeds from `seed`, held-out seeds from HELDOUT_SEED_OFFSET + `seed`): reset with that seed gives the
prompt, and the model acts through one tool, `step`, whose parameters are the environment's action schema (its
GET /schema). `acquire`, `run_step` and `env_outcome` are the episode loop's and the judge's hooks
(agents/loop.py, tasks/judge/verify.py): the row's reward is the environment's, its verifier strength 'env'.

For trainers: `EpisodeClient`, a blocking client of one session over openenv's `GenericEnvClient`
(training/environment.py gives TRL's GRPOTrainer an environment class on it).

openenv-core is an optional extra (`pip install -e '.[openenv]'`); without it every entry point raises
OpenEnvMissing naming the install command. This module runs no episode and writes no row.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import cache
from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import ExecResult, SandboxError
from tasks.spec import ReferenceSolution, Task, VerifierSpec

OPENENV_CORE = "0.3.0"  # the openenv-core version this module speaks (pyproject's `openenv` extra pins it)
PREFIX = "openenv:"  # a suite name `openenv:URL` is an environment served at URL
STEP_TOOL = "step"
HELDOUT_SEED_OFFSET = 1_000_000  # held-out tasks reset with seeds from here: never a train task's seed
PROMPT_KEYS = ("prompt", "instruction", "question", "message", "text")  # an observation's text, when it has one
MESSAGE_TIMEOUT_S = 600.0  # a step of a served suite runs tool calls and, at the end, the judge


class OpenEnvError(ValueError):
    """An OpenEnv environment cannot be used as asked (unreachable, no action schema, a bad suite name)."""


class OpenEnvMissing(OpenEnvError):
    """openenv-core is not installed."""


def _require() -> None:
    try:
        import openenv.core  # noqa: F401
    except ImportError:
        raise OpenEnvMissing(f"OpenEnv needs the openenv-core package: pip install -e '.[openenv]' (or pip install "
                             f"openenv-core=={OPENENV_CORE})") from None


def installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("openenv-core")
    except metadata.PackageNotFoundError:
        return "absent"


# ------------------------------------------------------------------------------------------------ the wire


class StepView(BaseModel):
    """What an episode session returns for a reset or a step: the fields of the wire's observation."""

    task_id: str
    suite: str
    messages: list[dict[str, Any]] = Field(default_factory=list, description="New conversation messages in the "
                                           "OpenAI chat format: on reset the opening (system, user), then each step's "
                                           "tool results or next user turn.")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="The task's tool schemas (reset only).")
    done: bool = False
    reward: float | None = None
    verdict: str | None = None
    hack_flags: list[str] = Field(default_factory=list)
    verifier_strength: str | None = None
    trajectory_id: str | None = None
    error: str | None = None


@cache
def wire_types() -> tuple[type, type]:
    """(EnvAction, EnvObservation): openenv pydantic types of a served suite (built on first use: the package is
    optional and slow to import)."""
    _require()
    from openenv.core.env_server.types import Action, Observation

    class EnvAction(Action):
        """One assistant turn: its text, reasoning and tool calls (OpenAI's {"function": {"name", "arguments"}} or
        flat {"name", "arguments"}), and the engine's token ids and logprobs when the client has them."""

        content: str = ""
        reasoning: str | None = None
        tool_calls: list[dict[str, Any]] = Field(default_factory=list)
        prompt_token_ids: list[int] | None = None
        completion_token_ids: list[int] | None = None
        logprobs: list[float] | None = None

    fields = {k: (f.annotation, f) for k, f in StepView.model_fields.items() if k not in ("done", "reward")}
    from pydantic import create_model

    EnvObservation = create_model("EnvObservation", __base__=Observation, **fields)
    EnvObservation.__doc__ = StepView.__doc__
    return EnvAction, EnvObservation


def action_message(action: dict[str, Any]) -> dict[str, Any]:
    """An EnvAction's fields as an OpenAI assistant message (flat tool calls put in OpenAI's shape)."""
    calls = []
    for c in action.get("tool_calls") or []:
        if isinstance(c, dict) and "function" not in c and "name" in c:
            c = {"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})},
                 **({"id": c["id"]} if c.get("id") else {})}
        calls.append(c)
    msg: dict[str, Any] = {"role": "assistant", "content": action.get("content") or None}
    if action.get("reasoning"):
        msg["reasoning"] = action["reasoning"]
    if calls:
        msg["tool_calls"] = calls
    return msg


def suite_environment(session_factory: Callable[[], Any]) -> type:
    """An openenv `Environment` class whose instances each hold one `session_factory()` (an object with
    reset(seed, task_id, policy) -> StepView, step(action: dict) -> StepView, close())."""
    _require()
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import State

    _, env_observation = wire_types()

    def observation(view: StepView) -> Any:
        meta = {"verdict": view.verdict, "hack_flags": view.hack_flags, "verifier_strength": view.verifier_strength,
                "trajectory_id": view.trajectory_id} if view.done else {}
        return env_observation(**view.model_dump(), metadata=meta)

    class SuiteEnvironment(Environment):
        """A flywheel suite: reset to a task, step through its tools in a sandbox, judged at the end."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._session = session_factory()
            self._state = State(episode_id=None, step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
                  policy: str | None = None) -> Any:
            view = self._session.reset(seed=seed, task_id=task_id, policy=policy)
            self._state = State(episode_id=episode_id or view.task_id, step_count=0)
            return observation(view)

        def step(self, action: Any, timeout_s: float | None = None) -> Any:
            self._state.step_count += 1
            return observation(self._session.step(action.model_dump(exclude={"metadata"})))

        @property
        def state(self) -> Any:
            return self._state

        def close(self) -> None:
            self._session.close()

    return SuiteEnvironment


def create_server_app(session_factory: Callable[[], Any], *, name: str, max_sessions: int) -> Any:
    """A FastAPI app from openenv-core's own `create_app` around `suite_environment(session_factory)`: one session
    per WebSocket connection, at most `max_sessions` at once."""
    from openenv.core.env_server.http_server import create_app

    env_action, env_observation = wire_types()
    return create_app(suite_environment(session_factory), env_action, env_observation, env_name=name,
                      max_concurrent_envs=max_sessions)


# ------------------------------------------------------------------------------------------------ clients


class EpisodeClient:
    """A blocking client of one OpenEnv session (openenv's GenericEnvClient over its WebSocket): dicts in and out."""

    def __init__(self, base_url: str, *, message_timeout_s: float = MESSAGE_TIMEOUT_S) -> None:
        _require()
        from openenv.core.generic_client import GenericEnvClient

        self.base_url = base_url.rstrip("/")
        self._client = GenericEnvClient(base_url=self.base_url, message_timeout_s=message_timeout_s).sync()
        try:
            self._client.connect()
        except Exception as e:
            raise OpenEnvError(f"cannot open an OpenEnv session at {self.base_url}: {e}; start the environment "
                               "server first (e.g. `flywheel env serve arithmetic --port PORT`)") from e

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], float | None, bool]:
        r = self._client.reset(**kwargs)
        return dict(r.observation or {}), r.reward, bool(r.done)

    def step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool]:
        r = self._client.step(action)
        return dict(r.observation or {}), r.reward, bool(r.done)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # noqa: BLE001,S110 - closing a session is best effort: the server ends it on disconnect
            pass


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read().decode())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise OpenEnvError(f"cannot read {url}: {e}; is an OpenEnv environment served there?") from e


# ------------------------------------------------------------------------------------------------ a suite of it


def parse_suite(name: str) -> str:
    """The environment's base URL of a suite name `openenv:URL`."""
    url = name[len(PREFIX):].strip().rstrip("/")
    if not name.startswith(PREFIX) or not re.match(r"^(https?|wss?)://[^/\s]+", url):
        raise OpenEnvError(f"suite {name!r} is not an OpenEnv environment; write it as "
                           "openenv:http://HOST:PORT (the environment server's base URL)")
    return re.sub(r"^ws", "http", url)


def step_tool(action_schema: dict[str, Any], env_name: str) -> dict[str, Any]:
    """The `step` tool: its parameters are the environment's action schema (less openenv's metadata field)."""
    props = {k: v for k, v in (action_schema.get("properties") or {}).items() if k != "metadata"}
    params: dict[str, Any] = {"type": "object", "properties": props,
                              "required": [k for k in action_schema.get("required") or [] if k in props]}
    if action_schema.get("$defs"):
        params["$defs"] = action_schema["$defs"]
    return {"type": "function", "function": {
        "name": STEP_TOOL, "description": f"Take one action in the {env_name} environment; returns its observation, "
                                          "reward and whether the episode is done.", "parameters": params}}


def observation_text(obs: dict[str, Any]) -> str:
    """An observation as the model reads it: its prompt-like text field when it has one, else its JSON."""
    for k in PROMPT_KEYS:
        if isinstance(obs.get(k), str) and obs[k].strip():
            return obs[k]
    return json.dumps(obs, sort_keys=True, ensure_ascii=False)


def load_openenv(name: str, n: int, *, split: str = "train", seed: int = 0) -> list[Task]:
    """n tasks of the environment at `openenv:URL`: task i resets with seed (seed + i), or for held-out tasks
    (HELDOUT_SEED_OFFSET + seed + i); its prompt is that reset's observation."""
    url = parse_suite(name)
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    schema = _get_json(url + "/schema")
    action = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action, dict) or not action.get("properties"):
        raise OpenEnvError(f"{url}/schema gives no action schema with properties; flywheel's `step` tool needs one")
    meta = _get_json(url + "/metadata")
    env_name = str(meta.get("name") or "env") if isinstance(meta, dict) else "env"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", env_name).strip("-") or "env"
    tool = step_tool(action, env_name)
    version = f"openenv-core-{installed_version()}:{slug}"
    base = seed + (HELDOUT_SEED_OFFSET if split == "heldout" else 0)
    system = (f"You act in the OpenEnv environment {env_name}. Call the `step` tool with an action; each call "
              "returns the environment's observation, its reward and whether the episode is done. When it is done, "
              "reply with a short final message without a tool call.")
    tasks: list[Task] = []
    client = EpisodeClient(url)
    try:
        for i in range(n):
            obs, _, _ = client.reset(seed=base + i)
            tasks.append(Task(
                id=f"openenv-{slug}-{split}-{base + i}", suite=f"openenv-{slug}", version=version,
                split=split,  # type: ignore[arg-type]
                prompt=observation_text(obs), system=system, tools=[STEP_TOOL], tool_specs=[tool],
                verifier=VerifierSpec(kind="openenv"),
                reference=ReferenceSolution(final="(an OpenEnv environment gives no reference solution)"),
                metadata={"openenv_url": url, "seed": base + i, "env_name": env_name}))
    finally:
        client.close()
    return tasks


class EnvSession:
    """An episode's session with the environment: what the loop holds where other tasks hold a sandbox."""

    backend = "openenv"

    def __init__(self, task: Task) -> None:
        self.url = task.metadata["openenv_url"]
        self.image = self.url
        self.client = EpisodeClient(self.url)
        self.steps = 0
        obs, self.reward, self.done = self.client.reset(seed=task.metadata["seed"])
        self.prompt_matches = observation_text(obs) == task.prompt  # a seeded environment resets the same way

    def close(self) -> None:
        self.client.close()


def acquire(task: Task, backend: Any = None) -> EnvSession:
    """The episode's session, reset with the task's seed; SandboxError when the environment cannot be reached."""
    try:
        return EnvSession(task)
    except OpenEnvError as e:
        raise SandboxError(str(e)) from e


def run_step(session: EnvSession, args: dict[str, Any]) -> ExecResult:
    """One `step` call: the environment's observation, reward and done as the tool's output. An action the
    environment refuses (a validation error) is the model's: its error is the output; a lost session is infra."""
    if session.done:
        return ExecResult(exit_code=1, stdout=f"the episode is over (reward {session.reward}); reply with your final "
                                              "message", verdict="error")
    try:
        obs, reward, done = session.client.step(args)
    except RuntimeError as e:
        if "VALIDATION_ERROR" in str(e):
            return ExecResult(exit_code=1, stdout=f"error: the environment refused the action: {e}", verdict="error")
        raise SandboxError(f"OpenEnv step at {session.url} failed: {e}") from e
    except Exception as e:
        raise SandboxError(f"OpenEnv step at {session.url} failed: {type(e).__name__}: {e}") from e
    session.steps += 1
    session.reward, session.done = reward, done
    return ExecResult(exit_code=0, stdout=json.dumps({"observation": obs, "reward": reward, "done": done},
                                                     ensure_ascii=False, default=str), verdict="ok")


def env_outcome(task: Task, session: EnvSession | None) -> tuple[float, bool, dict[str, Any]]:
    """(reward, passed, details) from the environment's own reward: passed when it said done with a reward > 0.
    An episode that never stepped scores 0."""
    reward = float(session.reward or 0.0) if session is not None and session.steps else 0.0
    done = bool(session is not None and session.done and session.steps)
    details = {"env_url": task.metadata.get("openenv_url"), "env_done": done, "env_reward": reward,
               "env_steps": session.steps if session is not None else 0,
               "env_prompt_matches": session.prompt_matches if session is not None else None}
    return reward, done and reward > 0, details
