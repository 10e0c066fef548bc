"""The OpenAI-compatible policy (vLLM, `transformers serve`, hosted APIs) and the chat-format helpers around it.

`OpenAIPolicy.reply` sends the conversation and the task's tool schemas to `/chat/completions` with the `openai`
AsyncOpenAI client and turns the first choice into a `PolicyReply`:
- bounded concurrency per policy (an asyncio.Semaphore held only while a request is in flight, not while backing
  off), a per-request timeout; requests go round-robin over ceil(concurrency / CONNECTIONS_PER_POOL) clients (at
  most MAX_POOLS), each with its own connection pool, since the HTTP stack checks every idle connection of a pool
  (a syscall each) on every request: one pool of 64 connections cost more client CPU than the rest of a request;
  under each client the SDK's aiohttp transport by default (`http="aiohttp"`: its C HTTP parser takes ~40% less
  client CPU per request than httpx's pure-Python one, benchmarks/http_client.py), or `http="httpx"`;
- retries done here, not by the client (its max_retries is 0): 408/409/429/5xx, timeouts and dropped connections
  are retried up to `max_retries` times with jittered exponential backoff, honouring Retry-After / retry-after-ms
  (capped at `retry_after_max_s`); then `EndpointError` (-> infra_error row, retried by the rollout runner);
- no retry where retrying cannot help: a 400/413 about context length -> `ContextLengthError` (model_error row);
  any other 4xx -> `RequestRejected` (infra_error, the runner does not retry it either), naming status and fix;
- usage tokens, cost from a price table (USD per 1M prompt / completion tokens), finish reason;
- logprobs (`logprobs=True`) and completion token ids when the server returns them (vLLM: `return_token_ids` in
  `extra_body` -> `choices[i].token_ids`, or `return_tokens_as_token_ids` -> logprob tokens "token_id:N");
- tool calls kept exactly as produced (arguments as the raw JSON string): the episode loop decodes them, so bad
  JSON or an unknown tool becomes a model_error row, never a crash. With `text_tool_calls` (default on), a reply
  whose content carries Hermes/Qwen `<tool_call>{...}</tool_call>` blocks that the server did not parse (a server
  started without a tool parser) is parsed here; an empty reply raises `EmptyReply` (model_error).

Reusable helpers (the in-process transformers and vLLM policies use them): `parse_tool_call_text` (Hermes/Qwen
tool-call text -> content + ToolCalls), `message_from_openai` (an OpenAI response message -> our Message),
`to_openai_messages`, `cost_usd`, `retry_after_seconds`, `is_context_length_message`.
`check_endpoint` is the CLI's preflight: an unreachable endpoint or unknown model fails fast with one clear line.
This module does not run episodes (agents/loop.py) or read config files (agents/config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import random
import re
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import Any

from agents.policy import ContextLengthError, EndpointError, ModelError, PolicyReply, RequestRejected
from tasks.spec import Task
from warehouse.record import FunctionCall, Message, Source, ToolCall

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
CONNECTIONS_PER_POOL = 8  # requests in flight per HTTP client (see the module docstring)
MAX_POOLS = 16
HTTP_STACKS = ("aiohttp", "httpx")  # the SDK's transports: aiohttp's (C HTTP parser) or httpx's own (pure Python)
_CONTEXT_RE = re.compile(
    r"context[ _]length|maximum context|context window|context_length_exceeded|maximum model length|"
    r"prompt is too long|too many tokens|max_model_len|exceeds the model", re.IGNORECASE)
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")


class EmptyReply(ModelError):
    """The model answered with neither content nor tool calls."""


# ---------------------------------------------------------------------------------------------------- helpers


def is_context_length_message(text: str) -> bool:
    """Whether an endpoint's error text says the prompt does not fit the model's context."""
    return bool(_CONTEXT_RE.search(text or ""))


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date); None when absent/bad."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def cost_usd(prompt_tokens: int, completion_tokens: int, prompt_per_1m: float, completion_per_1m: float) -> float:
    """Cost of one request from a price table in USD per 1M tokens."""
    return prompt_tokens * prompt_per_1m / 1e6 + completion_tokens * completion_per_1m / 1e6


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


def parse_tool_call_text(text: str | None) -> tuple[str | None, list[ToolCall]]:
    """Split Hermes/Qwen-style text into (content before the calls, tool calls).

    Each `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block becomes a ToolCall whose arguments are
    re-encoded JSON. A block that is not valid JSON, or lacks a name, becomes a call named "<malformed>" with the raw
    text as its arguments, so the episode loop records a model_error instead of silently dropping it.
    Text without blocks returns (text, []).
    """
    if not text or "<tool_call>" not in text:
        return text, []
    head = text.split("<tool_call>", 1)[0].strip() or None
    calls: list[ToolCall] = []
    for raw in _TOOL_CALL_RE.findall(text):
        name, args = "<malformed>", raw
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            name = obj["name"]
            a = obj.get("arguments", obj.get("parameters", {}))
            args = a if isinstance(a, str) else json.dumps(a)
        calls.append(ToolCall(id=_call_id(), function=FunctionCall(name=name, arguments=args)))
    return head, calls


def _arguments_str(arguments: Any) -> str:
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def message_from_openai(msg: Any, *, text_tool_calls: bool = True) -> Message:
    """An OpenAI chat response message (object or dict) -> our assistant Message, tool-call arguments verbatim."""
    get = (lambda k: msg.get(k)) if isinstance(msg, dict) else (lambda k: getattr(msg, k, None))
    content = get("content")
    calls: list[ToolCall] = []
    for tc in get("tool_calls") or []:
        tget = (lambda k, tc=tc: tc.get(k)) if isinstance(tc, dict) else (lambda k, tc=tc: getattr(tc, k, None))
        fn = tget("function")
        if fn is None:  # a non-function (custom) tool call: keep it visible, the loop rejects it
            name, args = str(tget("type") or "<malformed>"), _arguments_str(tget("custom") or "")
        elif isinstance(fn, dict):
            name, args = str(fn.get("name") or "<malformed>"), _arguments_str(fn.get("arguments"))
        else:
            name, args = str(getattr(fn, "name", None) or "<malformed>"), _arguments_str(getattr(fn, "arguments", None))
        calls.append(ToolCall(id=tget("id") or _call_id(), function=FunctionCall(name=name, arguments=args)))
    if not calls and text_tool_calls:
        content, calls = parse_tool_call_text(content)
    return Message(role="assistant", content=content, tool_calls=calls or None)


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in messages]


def _logprobs_and_ids(choice: Any) -> tuple[list[float] | None, list[int] | None]:
    logprobs: list[float] | None = None
    ids: list[int] | None = None
    lp = getattr(choice, "logprobs", None)
    content = getattr(lp, "content", None) if lp is not None else None
    if content:
        logprobs = [float(t.logprob) for t in content]
        parsed = [_TOKEN_ID_RE.match(t.token or "") for t in content]
        if all(parsed):
            ids = [int(m.group(1)) for m in parsed if m]
    extra = getattr(choice, "model_extra", None) or {}
    if isinstance(extra.get("token_ids"), list):
        ids = [int(x) for x in extra["token_ids"]]
    return logprobs, ids


def _status_fix(status: int, base_url: str, model: str, api_key_env: str | None) -> str:
    if status in (401, 403):
        return f"check the API key (set {api_key_env or 'the api_key_env variable'}) for {base_url}"
    if status == 404:
        return f"check the model name {model!r} and that {base_url} is the server's /v1 base URL"
    return "check the request options (tools, sampling params, extra_body) against the server's docs"


# ---------------------------------------------------------------------------------------------------- policy


class OpenAIPolicy:
    """A policy served by an OpenAI-compatible endpoint. See the module docstring for retries and errors."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        name: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        source: Source = "teacher",
        temperature: float | None = 0.7,
        top_p: float | None = None,
        max_tokens: int | None = 512,
        seed: int | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        concurrency: int = 16,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 20.0,
        retry_after_max_s: float = 60.0,
        prompt_price_per_1m: float = 0.0,
        completion_price_per_1m: float = 0.0,
        logprobs: bool = False,
        text_tool_calls: bool = True,
        extra_body: dict[str, Any] | None = None,
        http: str = "aiohttp",
    ) -> None:
        if http not in HTTP_STACKS:
            raise ValueError(f"http must be one of {', '.join(HTTP_STACKS)}, got {http!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.name = name or model
        self.source: Source = source
        self.endpoint: str | None = base_url
        self.base_url = base_url
        self.model = model
        self.api_key = api_key or "EMPTY"
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.seed = seed
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_max_s = retry_after_max_s
        self.prompt_price_per_1m = prompt_price_per_1m
        self.completion_price_per_1m = completion_price_per_1m
        self.logprobs = logprobs
        self.text_tool_calls = text_tool_calls
        self.extra_body = dict(extra_body or {})
        self.http = http
        self.requests_sent = 0  # HTTP attempts, for tests and summaries
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = weakref.WeakKeyDictionary()

    @property
    def sampling(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.model, "temperature": self.temperature, "top_p": self.top_p,
                             "max_tokens": self.max_tokens, "seed": self.seed, "logprobs": self.logprobs}
        if self.extra_body:
            d["extra_body"] = self.extra_body
        return {k: v for k, v in d.items() if v is not None}

    def _ensure(self) -> tuple[Any, asyncio.Semaphore]:
        """A client (round-robin over this loop's pools) and the loop's semaphore (each event loop gets its own:
        asyncio objects are loop-bound)."""
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            from openai import AsyncOpenAI, DefaultAioHttpClient, DefaultAsyncHttpxClient

            http_client = DefaultAioHttpClient if self.http == "aiohttp" else DefaultAsyncHttpxClient
            pools = max(1, min(MAX_POOLS, math.ceil(self.concurrency / CONNECTIONS_PER_POOL)))
            ctx = _ssl_context()  # one for all pools: building it is most of a client's set-up cost
            clients = [AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0,
                                   http_client=http_client(verify=ctx)) for _ in range(pools)]
            state = self._per_loop[loop] = [clients, asyncio.Semaphore(self.concurrency), 0, 0]
        state[3] = (state[3] + 1) % len(state[0])
        return state[0][state[3]], state[1]

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[OpenAIPolicy]:
        """Scope of this loop's HTTP client: closed when the last open session of the loop ends (the rollout
        runner opens one per run), so no connection outlives its event loop."""
        self._ensure()
        state = self._per_loop[asyncio.get_running_loop()]
        state[2] += 1
        try:
            yield self
        finally:
            state[2] -= 1
            if state[2] == 0:
                self._per_loop.pop(asyncio.get_running_loop(), None)
                for client in state[0]:
                    await client.close()

    async def aclose(self) -> None:
        """Close the running loop's client (sessions do this for you)."""
        state = self._per_loop.pop(asyncio.get_running_loop(), None)
        if state is not None:
            for client in state[0]:
                await client.close()

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_max_s) + random.uniform(0, 0.1 * min(retry_after, 1.0))
        return min(self.backoff_max_s, self.backoff_base_s * 2 ** attempt) * random.uniform(0.5, 1.0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]], sample_index: int) -> dict[str, Any]:
        """The JSON body of one chat-completions request (extra_body merged in, as the SDK merges it)."""
        kw: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages)}
        if tools:
            kw["tools"] = tools
        if self.temperature is not None:
            kw["temperature"] = self.temperature
        if self.top_p is not None:
            kw["top_p"] = self.top_p
        if self.max_tokens is not None:
            kw["max_tokens"] = self.max_tokens
        if self.seed is not None:
            kw["seed"] = self.seed + sample_index
        if self.logprobs:
            kw["logprobs"] = True
        if self.extra_body:
            kw.update(self.extra_body)
        return kw

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        import openai
        from openai.types.chat import ChatCompletion

        client, sem = self._ensure()
        request = self._request(messages, tools, sample_index)
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                async with sem:
                    self.requests_sent += 1
                    # The client's own POST, not chat.completions.create: create() first runs the body through the
                    # SDK's typed-dict transform, which cost more CPU than the rest of the request (the body here is
                    # plain JSON already). Same HTTP request, response parsing, errors and exceptions.
                    resp = await client.post("/chat/completions", cast_to=ChatCompletion, body=request,
                                             options={"timeout": self.timeout_s})
                return self._to_reply(resp)
            except openai.APIStatusError as e:
                status = e.status_code
                body = _error_text(e)
                if status in (400, 413) and is_context_length_message(body):
                    raise ContextLengthError(f"{self.base_url} model {self.model!r}: context too long "
                                             f"(HTTP {status}): {body[:300]}") from None
                if status not in RETRY_STATUSES:
                    raise RequestRejected(f"{self.base_url} rejected the request with HTTP {status}: {body[:300]}; "
                                          f"fix: {_status_fix(status, self.base_url, self.model, self.api_key_env)}"
                                          ) from None
                retry_after = retry_after_seconds(e.response.headers)
                last = f"HTTP {status}: {body[:200]}"
            except openai.APITimeoutError:
                last = f"no answer within {self.timeout_s:g} s (timeout_s)"
            except openai.APIConnectionError as e:
                last = f"connection failed: {e.__cause__ or e}"
            if attempt < self.max_retries:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        raise EndpointError(f"{self.base_url} model {self.model!r} failed after {self.max_retries + 1} attempts "
                            f"(last: {last}); fix: check the server is up and not overloaded, or raise "
                            "max_retries / timeout_s")

    def _to_reply(self, resp: Any) -> PolicyReply:
        if not getattr(resp, "choices", None):
            raise ModelError(f"{self.base_url} returned no choices")
        choice = resp.choices[0]
        if choice.message is None:
            raise ModelError(f"{self.base_url} returned a choice without a message")
        message = message_from_openai(choice.message, text_tool_calls=self.text_tool_calls)
        if not message.tool_calls and not (message.content or "").strip():
            raise EmptyReply(f"the model replied with neither content nor tool calls "
                             f"(finish_reason={choice.finish_reason!r})")
        usage = getattr(resp, "usage", None)
        pt = int(getattr(usage, "prompt_tokens", 0) or 0)
        ct = int(getattr(usage, "completion_tokens", 0) or 0)
        logprobs, ids = _logprobs_and_ids(choice)
        return PolicyReply(message=message, prompt_tokens=pt, completion_tokens=ct,
                           cost_usd=cost_usd(pt, ct, self.prompt_price_per_1m, self.completion_price_per_1m),
                           finish_reason=choice.finish_reason, token_ids=ids, logprobs=logprobs)


def _error_text(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("code") or err)
        return str(err)
    if body:
        return str(body)
    return str(getattr(e, "message", "") or e)


# ---------------------------------------------------------------------------------------------------- preflight


def _ssl_context() -> Any:
    """The SSL context the SDK's HTTP client builds by default (system trust store, SSL_CERT_FILE honoured)."""
    try:
        from httpx2 import create_ssl_context  # openai >= 3 ships its own fork of httpx
    except ImportError:
        from httpx import create_ssl_context
    return create_ssl_context()


def check_endpoint(base_url: str, model: str | None = None, timeout: float = 5.0, api_key: str | None = None) -> list[str]:
    """Preflight: GET {base_url}/models. Returns the served model ids.

    Raises EndpointError with one line naming the URL and the fix when the endpoint is unreachable, answers an
    error, is not OpenAI-compatible, or does not serve `model`.
    """
    import httpx

    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url, timeout=timeout, headers=headers)
    except httpx.HTTPError as e:
        raise EndpointError(
            f"cannot reach the OpenAI-compatible endpoint {base_url} ({type(e).__name__}: {e}); fix: start the "
            f"server (e.g. `vllm serve MODEL` or `transformers serve MODEL_DIR`) or pass the right --base-url "
            f"(it should end in /v1)") from None
    if r.status_code in (401, 403):
        raise EndpointError(f"{url} answered HTTP {r.status_code}; fix: set the API key (teacher.api_key_env)")
    if r.status_code != 200:
        raise EndpointError(f"{url} answered HTTP {r.status_code}; fix: pass the server's OpenAI base URL "
                            "(usually http://HOST:PORT/v1) as --base-url")
    try:
        ids = [str(m["id"]) for m in r.json().get("data", [])]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise EndpointError(f"{url} did not return an OpenAI model list; fix: point --base-url at an "
                            "OpenAI-compatible server (usually http://HOST:PORT/v1)") from None
    if model is not None and ids and model not in ids:
        raise EndpointError(f"{base_url} does not serve model {model!r} (it serves: {', '.join(ids[:10])}); "
                            "fix: pass one of these as --model")
    return ids
