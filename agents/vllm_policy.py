"""vLLM policies (the `gpu` extra): the offline engine in this process, or `vllm serve` behind the OpenAI policy.

- `VLLMPolicy`: vLLM's offline engine (`vllm.LLM`). Concurrent episodes' turns are gathered by a `MicroBatcher`
  (a few ms window, up to `max_batch` conversations) into one `LLM.chat(conversations, sampling_params, tools=...)`
  call run in a worker thread, one engine call at a time (turns that arrive meanwhile form the next batch). The
  chat template renders the tool schemas; the completion's token ids are read as the in-process transformers
  policy reads them (`agents.transformers_policy.TurnReader`: decoded with special tokens, not vLLM's text, which
  drops harmony's markers; parsed by the one codec, `warehouse.chat.parse_text`, in the dialect of the model's chat
  template, Hermes `<tool_call>` blocks or GPT-OSS harmony; an empty or malformed reply is the loop's to judge),
  with the template's hash and the model's version. Prompt and completion token ids are always recorded; logprobs
  of the sampled tokens when `logprobs=True` (SamplingParams(logprobs=0)).
- The server path: `serve_argv(model, ...)` is the `vllm serve MODEL --enable-auto-tool-choice --tool-call-parser
  hermes` command line, `VLLMServer` starts it and waits for /v1/models, and `server_policy(...)` is an
  `OpenAIPolicy` on it asking for prompt and completion token ids (`token_ids=True`: vLLM's `return_token_ids`)
  and logprobs.
`require_vllm()` raises PolicySetupError naming `pip install 'flywheel[gpu]'` when vllm is missing; nothing imports
vllm at module level, so this module (and `MicroBatcher`, reusable by any batched in-process policy) imports
everywhere. This module does not pick GPUs or install anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

from agents.openai_policy import OpenAIPolicy, check_endpoint
from agents.policy import EndpointError, ModelError, PolicyReply, PolicySetupError
from agents.transformers_policy import TurnReader
from tasks.spec import Task
from warehouse import chat
from warehouse.record import Message, Source

GPU_FIX = "pip install 'flywheel[gpu]' on a machine with a CUDA GPU (or serve the model with `vllm serve` elsewhere " \
          "and use kind='openai')"

T = TypeVar("T")
R = TypeVar("R")


def require_vllm() -> Any:
    """Import vllm or raise PolicySetupError with the install command."""
    try:
        import vllm
    except ImportError as e:
        raise PolicySetupError(f"the vllm policy needs the `vllm` package, which is not installed ({e}); "
                               f"fix: {GPU_FIX}") from None
    return vllm


class MicroBatcher(Generic[T, R]):
    """Gather concurrent `submit(item)` calls into batches for a synchronous `fn(list[T]) -> list[R]`.

    A batch closes after `window_s` or at `max_batch` items; `fn` runs in a worker thread, one call at a time, and
    items that arrive while it runs form the next batch. An exception from `fn` is raised in every caller of that
    batch. Bound to the event loop of its first use (create one per loop).
    """

    def __init__(self, fn: Callable[[list[T]], list[R]], *, max_batch: int = 64, window_s: float = 0.005) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.fn = fn
        self.max_batch = max_batch
        self.window_s = window_s
        self.batches: list[int] = []  # sizes of the batches run, for tests and tuning
        self._pending: list[tuple[T, asyncio.Future]] = []
        self._lock: asyncio.Lock | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        if self._lock is None:
            self._lock = asyncio.Lock()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((item, fut))
        if len(self._pending) >= self.max_batch:
            self._kick(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self.window_s, self._kick, loop)
        return await fut

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            loop.create_task(self._run())

    async def _run(self) -> None:
        assert self._lock is not None
        async with self._lock:
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            if self._pending and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.window_s, self._kick,
                                                                    asyncio.get_running_loop())
            if not batch:
                return
            self.batches.append(len(batch))
            try:
                results = await asyncio.to_thread(self.fn, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} items")
            except BaseException as e:  # noqa: BLE001 - handed to every waiter
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                return
            for (_, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)


class VLLMPolicy:
    """A policy on vLLM's offline engine; see the module docstring."""

    def __init__(self, *, model: str, name: str | None = None, source: Source = "teacher",
                 temperature: float | None = 0.7, top_p: float | None = None, max_tokens: int | None = 512,
                 seed: int = 0, logprobs: bool = False, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, max_batch: int = 256, window_s: float = 0.01,
                 llm: Any = None, engine_kwargs: dict[str, Any] | None = None) -> None:
        vllm = require_vllm()
        self.name = name or model
        self.source: Source = source
        self.endpoint: str | None = f"vllm-offline://{model}"
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.seed = seed
        self.logprobs = logprobs
        kw = {"model": model, "gpu_memory_utilization": gpu_memory_utilization, **(engine_kwargs or {})}
        if max_model_len:
            kw["max_model_len"] = max_model_len
        self.llm = llm if llm is not None else vllm.LLM(**kw)
        self.reader = TurnReader(self.llm.get_tokenizer(), model)
        self._SamplingParams = vllm.SamplingParams
        self.max_batch = max_batch
        self.window_s = window_s
        self._batchers: dict[tuple[int, str], MicroBatcher] = {}

    @classmethod
    def from_config(cls, cfg: Any) -> VLLMPolicy:
        return cls(model=cfg.model, name=cfg.policy_name(), source=cfg.source, temperature=cfg.temperature,
                   top_p=cfg.top_p, max_tokens=cfg.max_tokens, seed=cfg.seed, logprobs=cfg.logprobs,
                   gpu_memory_utilization=cfg.gpu_memory_utilization, max_model_len=cfg.max_model_len)

    @property
    def sampling(self) -> dict[str, Any]:
        d = {"engine": "vllm-offline", "model": self.model, "temperature": self.temperature, "top_p": self.top_p,
             "max_tokens": self.max_tokens, "seed": self.seed, "logprobs": self.logprobs}
        return {k: v for k, v in d.items() if v is not None}

    def _params(self, sample_index: int) -> Any:
        kw: dict[str, Any] = {"seed": self.seed * 1_000_003 + sample_index}
        if self.temperature is not None:
            kw["temperature"] = self.temperature
        if self.top_p is not None:
            kw["top_p"] = self.top_p
        if self.max_tokens is not None:
            kw["max_tokens"] = self.max_tokens
        if self.logprobs:
            kw["logprobs"] = 0  # the sampled token's logprob only
        return self._SamplingParams(**kw)

    def _generate(self, tools_json: str, items: list[tuple[list[dict[str, Any]], Any]]) -> list[PolicyReply]:
        tools = json.loads(tools_json) or None
        outs = self.llm.chat([m for m, _ in items], sampling_params=[p for _, p in items], tools=tools,
                             use_tqdm=False)
        return [self._to_reply(o, turn=len(m)) for o, (m, _) in zip(outs, items)]

    def _to_reply(self, req_out: Any, *, turn: int) -> PolicyReply:
        if not req_out.outputs:
            raise ModelError("vLLM returned no output for a request")
        out = req_out.outputs[0]
        ids = [int(t) for t in out.token_ids]
        lps: list[float] | None = None
        if self.logprobs and out.logprobs:
            lps = [float(step[tid].logprob) if tid in step else float("nan") for tid, step in zip(ids, out.logprobs)]
        return self.reader.reply(ids, turn=turn, prompt_ids=[int(t) for t in req_out.prompt_token_ids or []],
                                 logprobs=lps, finish=out.finish_reason)

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        tools_json = json.dumps(tools, sort_keys=True)
        key = (id(asyncio.get_running_loop()), tools_json)
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = MicroBatcher(lambda items, tj=tools_json: self._generate(tj, items), max_batch=self.max_batch,
                                   window_s=self.window_s)
            self._batchers[key] = batcher
        return await batcher.submit((chat.to_openai(messages), self._params(sample_index)))


# ------------------------------------------------------------------------------------------------ server path


def serve_argv(model: str, *, port: int = 8000, host: str = "127.0.0.1", tool_parser: str = "hermes",
               served_name: str | None = None, extra: list[str] | None = None) -> list[str]:
    """The `vllm serve` command line with tool calling on (the OpenAI policy then gets parsed tool_calls)."""
    exe = shutil.which("vllm")
    argv = [exe] if exe else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    argv += ["serve", model, "--host", host, "--port", str(port), "--enable-auto-tool-choice",
             "--tool-call-parser", tool_parser]
    if served_name:
        argv += ["--served-model-name", served_name]
    return argv + list(extra or [])


class VLLMServer:
    """`with VLLMServer(model, port=...) as srv:` starts `vllm serve`, waits until /v1/models answers, stops it."""

    def __init__(self, model: str, *, port: int = 8000, startup_timeout_s: float = 600.0,
                 log_path: str | None = None, **kw: Any) -> None:
        require_vllm()
        self.model = model
        self.port = port
        self.argv = serve_argv(model, port=port, **kw)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path or f"/tmp/vllm-serve-{port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Self:
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ})
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                check_endpoint(self.base_url, None, timeout=2.0)
                return self
            except EndpointError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise EndpointError(f"`{' '.join(self.argv)}` did not come up (see {self.log_path}); fix: check "
                                    "the model path, GPU memory and the vllm install")
            time.sleep(2.0)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def server_policy(base_url: str, model: str, *, name: str | None = None, logprobs: bool = True,
                  **kw: Any) -> OpenAIPolicy:
    """An OpenAIPolicy on a `vllm serve` endpoint that asks for prompt and completion token ids and logprobs."""
    return OpenAIPolicy(base_url=base_url, model=model, name=name, logprobs=logprobs, token_ids=logprobs, **kw)
