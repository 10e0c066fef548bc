"""A suite served as an OpenEnv environment: each session plays the episode loop with the client as its policy.

`SuiteServer` holds what every session shares: the suite's tasks, the sandbox backend, the lake and the run id.
`EpisodeSession` is one OpenEnv session (tasks/openenv.py wraps it in openenv-core's Environment):

- `reset(seed=, task_id=, policy=)` picks the task (by id; else by seed, task `seed mod n`; else the next one in
  order) and returns the opening messages and the task's tool schemas. No episode runs yet: a reset that is never
  stepped leaves no row.
- `step(action)` hands one assistant turn to the episode. The first step starts `agents.loop.run_episode` on its own
  thread with a `ClientPolicy`, whose `reply` waits for the client's next turn: the loop checks the turn's calls,
  runs them in the task's sandbox and asks for the next reply, which the step returns as the new messages (tool
  results, or the next user turn of a multi-turn task). A turn without tool calls ends the episode: the loop's judge
  (verifier, forensics, reward terms) gives the verdict, the row is written to the lake, and the step returns done
  with the reward, the verdict, the hack reason codes, the verifier strength and the trajectory id. A malformed call,
  an unknown tool or an empty turn ends it too, as `model_error`, exactly as in any rollout.
- A reset or a disconnect before the end abandons the episode: the loop gets `EpisodeAbandoned` (a ModelError), so
  it is still a row, `model_error`, with what was played.

Rows have source 'env', policy `openenv:<name the client gave at reset, else 'client'>`, stage 'rollout', round 0
and the server's run id; the judge is the loop's, so a row here means what a rollout's row means. This module
imports no openenv (tasks/openenv.py does) and parses no model text (the client sends a parsed turn).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from agents.loop import initial_messages, run_episode
from agents.policy import ModelError, PolicyReply
from sandbox.result import Backend
from tasks.openenv import StepView, action_message
from tasks.spec import Task
from tasks.tools import tool_schemas
from warehouse import chat
from warehouse.record import Message, Trajectory

_ABANDON = object()


class EnvServerError(RuntimeError):
    """A client asked for something the served suite cannot do (a step before reset, an unknown task id)."""


class EpisodeAbandoned(ModelError):
    """The client reset or closed the session before the episode ended."""


@dataclass
class SuiteServer:
    """What the sessions of one served suite share."""

    tasks: list[Task]
    backend: Backend
    root: str
    run_id: str
    max_turns: int = 8
    step_timeout_s: float = 600.0
    verify_kwargs: dict[str, Any] = field(default_factory=dict)
    written: int = 0

    def __post_init__(self) -> None:
        if not self.tasks:
            raise EnvServerError("the suite gave no task to serve; ask for more (--n) or another split")
        self._by_id = {t.id: t for t in self.tasks}
        self._order = itertools.count()
        self._samples: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    def pick(self, *, seed: int | None, task_id: str | None) -> Task:
        if task_id is not None:
            if task_id not in self._by_id:
                raise EnvServerError(f"task {task_id!r} is not served here; served: {len(self.tasks)} tasks, "
                                     f"e.g. {self.tasks[0].id!r}")
            return self._by_id[task_id]
        with self._lock:
            i = seed if seed is not None else next(self._order)
        return self.tasks[i % len(self.tasks)]

    def sample_index(self, task_id: str) -> int:
        """The next sample index of this task (episodes of one task get distinct trajectory ids)."""
        with self._lock:
            return next(self._samples.setdefault(task_id, itertools.count()))

    def record(self, row: Trajectory) -> None:
        from warehouse.lake import write_trajectories

        with self._lock:
            write_trajectories(self.root, [row])
            self.written += 1

    def session(self) -> EpisodeSession:
        return EpisodeSession(self)


class ClientPolicy:
    """The policy of a served episode: each reply is the client's next step."""

    source = "env"
    endpoint = None

    def __init__(self, name: str, inbox: queue.Queue, outbox: queue.Queue) -> None:
        self.name = name
        self.inbox, self.outbox = inbox, outbox
        self._seen: int | None = None

    @property
    def sampling(self) -> dict[str, Any]:
        return {}

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        if self._seen is not None:  # what the loop added since the last turn: tool results, the next user turn
            self.outbox.put(("turn", messages[self._seen:]))
        self._seen = len(messages) + 1  # the loop appends this reply next
        action = await asyncio.to_thread(self.inbox.get)
        if action is _ABANDON:
            raise EpisodeAbandoned("the client reset or closed the session before the episode ended")
        return PolicyReply(message=chat.from_chat(action_message(action), turn=len(messages)),
                           token_ids=action.get("completion_token_ids"), logprobs=action.get("logprobs"),
                           prompt_token_ids=action.get("prompt_token_ids"))


class _Episode:
    """One served episode: the loop on its own thread, turns passed through two queues."""

    def __init__(self, server: SuiteServer, task: Task, policy: str) -> None:
        self.server, self.task = server, task
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.policy = ClientPolicy(f"openenv:{policy}", self.inbox, self.outbox)
        self.thread: threading.Thread | None = None
        self.row: Trajectory | None = None

    def _run(self) -> None:
        try:
            row = asyncio.run(run_episode(
                self.task, self.policy, self.server.backend, run_id=self.server.run_id, round=0,
                sample_index=self.server.sample_index(self.task.id), max_turns=self.server.max_turns,
                verify_kwargs=self.server.verify_kwargs or None))
            self.server.record(row)
            self.outbox.put(("done", row))
        except BaseException as e:  # noqa: BLE001 - the lake write failed: the step says so
            self.outbox.put(("error", e))

    def step(self, action: dict[str, Any]) -> StepView:
        if self.row is not None:
            raise EnvServerError(f"the episode of {self.task.id} is over; reset for the next one")
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=f"env-episode-{self.task.id}", daemon=True)
            self.thread.start()
        self.inbox.put(action)
        return self._answer()

    def _answer(self) -> StepView:
        try:
            kind, payload = self.outbox.get(timeout=self.server.step_timeout_s)
        except queue.Empty:
            raise EnvServerError(f"the episode of {self.task.id} gave no answer in {self.server.step_timeout_s} s"
                                 ) from None
        view = StepView(task_id=self.task.id, suite=self.task.suite)
        if kind == "turn":
            return view.model_copy(update={"messages": chat.to_openai(payload)})
        if kind == "error":
            raise EnvServerError(f"the episode of {self.task.id} could not be recorded: {payload}") from payload
        self.row = row = payload
        return view.model_copy(update={
            "done": True, "reward": row.reward, "verdict": row.verdict, "hack_flags": list(row.hack_flags),
            "verifier_strength": row.verifier_strength, "trajectory_id": row.trajectory_id,
            "error": f"{row.error_class}: {row.error_message}" if row.error_class else None})

    def abandon(self) -> None:
        """End an episode still in flight (its row is written, model_error EpisodeAbandoned)."""
        if self.thread is None or self.row is not None:
            return
        self.inbox.put(_ABANDON)
        while self.row is None:
            try:
                self._answer()
            except EnvServerError:
                break
        self.thread.join(timeout=self.server.step_timeout_s)


class EpisodeSession:
    """One client session of a served suite: reset, step, close (tasks/openenv.py's Environment calls these)."""

    def __init__(self, server: SuiteServer) -> None:
        self.server = server
        self.episode: _Episode | None = None

    def reset(self, *, seed: int | None = None, task_id: str | None = None, policy: str | None = None) -> StepView:
        self.close()
        task = self.server.pick(seed=seed, task_id=task_id)
        self.episode = _Episode(self.server, task, policy or "client")
        return StepView(task_id=task.id, suite=task.suite, messages=chat.to_openai(initial_messages(task)),
                        tools=tool_schemas(task.tools, task.tool_specs))

    def step(self, action: dict[str, Any]) -> StepView:
        if self.episode is None:
            raise EnvServerError("no episode: reset the environment before stepping")
        return self.episode.step(action)

    def close(self) -> None:
        ep, self.episode = self.episode, None
        if ep is not None:
            ep.abandon()
