"""The OpenAI-compatible policy (vLLM, `transformers serve`, hosted APIs) and the chat-format helpers around it.

`OpenAIPolicy.reply` POSTs the conversation and the task's tool schemas to `{base_url}/chat/completions` and turns
the first choice into a `PolicyReply`:
- plain aiohttp, one session (connection pool) per event loop, JSON in and out, not the `openai` SDK: on 2 cores
  a rollout of many episodes is bounded by the client's CPU per request, and the SDK's request building, httpx
  layers and typed response models cost about five times our whole request (benchmarks/http_client.py: 1.1 vs
  0.2 ms); proxies from HTTP(S)_PROXY / NO_PROXY, read once;
- bounded concurrency per policy (an asyncio.Semaphore held only while a request is in flight, not while backing
  off), a per-request timeout (the whole request, connect to last byte);
- retries done here: 408/409/429/5xx, timeouts, dropped connections and unreadable 2xx bodies
  are retried up to `max_retries` times with jittered exponential backoff, honouring Retry-After / retry-after-ms
  (capped at `retry_after_max_s`); then `EndpointError` (-> infra_error row, retried by the rollout runner);
- no retry where retrying cannot help: a 400/413 about context length -> `ContextLengthError` (model_error row);
  any other 4xx -> `RequestRejected` (infra_error, the runner does not retry it either), naming status and fix;
- usage tokens, cost from a price table (USD per 1M prompt / completion tokens), finish reason;
- logprobs (`logprobs=True`) and token ids when the server returns them: with `token_ids=True` the request asks
  vLLM for them (`return_token_ids: true`, a vLLM extension) and the reply keeps the prompt's ids (the response's
  `prompt_token_ids`) and the completion's (`choices[i].token_ids`); `return_tokens_as_token_ids` -> logprob
  tokens "token_id:N" also gives completion ids. The response's `model` (plus `system_fingerprint` when given)
  is the reply's model version;
- reasoning: the message's `reasoning` (vLLM's field) or `reasoning_content` (its older name) becomes the
  assistant message's `reasoning` (warehouse.chat.from_chat). Sent back in later turns as `reasoning_content`
  (`reasoning_history="field"`, what vLLM hands to the chat template), inside the content as `<think>` text
  ("inline": for a model whose template does not render reasoning, such as the default tiny student, so that the
  server's prompt is the conversation SFT trains on) or not at all ("drop");
- tool calls kept exactly as produced (arguments as the raw JSON string), read by `warehouse.chat.from_chat`
  (the one conversation codec): the episode loop decodes them, so bad JSON, an unknown tool or an empty reply
  becomes a model_error row, never a crash. With `text_tool_calls` (default on), a reply whose content carries
  Hermes/Qwen `<tool_call>{...}</tool_call>` blocks or GPT-OSS harmony text that the server did not parse (a
  server started without a tool parser) is parsed by the same codec, call ids `call_{turn}_{i}`. `transformers
  serve` parses harmony itself when the model folder carries TRL's response template (the tiny families do);
  without one it strips harmony's special tokens and nothing is left to parse. It returns no token ids or
  logprobs (it refuses `logprobs` with HTTP 422), so its rows carry none.

Reusable helpers: `cost_usd`, `retry_after_seconds`, `is_context_length_message`.
`check_endpoint` is the CLI's preflight: an unreachable endpoint or unknown model fails fast with one clear line.
This module does not run episodes (agents/loop.py) or read config files (agents/config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import re
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from agents.policy import ContextLengthError, EndpointError, ModelError, PolicyReply, RequestRejected
from tasks.spec import Task
from warehouse import chat
from warehouse.record import Message, Source

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_CONTEXT_RE = re.compile(
    r"context[ _]length|maximum context|context window|context_length_exceeded|maximum model length|"
    r"prompt is too long|too many tokens|max_model_len|exceeds the model", re.IGNORECASE)
_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")


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


def _logprobs_and_ids(choice: dict[str, Any]) -> tuple[list[float] | None, list[int] | None]:
    """Completion logprobs and token ids of a response choice (JSON), when the server returned them."""
    logprobs: list[float] | None = None
    ids: list[int] | None = None
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if content:
        logprobs = [float(t["logprob"]) for t in content]
        parsed = [_TOKEN_ID_RE.match(t.get("token") or "") for t in content]
        if all(parsed):
            ids = [int(m.group(1)) for m in parsed if m]
    if isinstance(choice.get("token_ids"), list):  # vLLM's return_token_ids
        ids = [int(x) for x in choice["token_ids"]]
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
        token_ids: bool = False,
        reasoning_history: str = "field",
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if reasoning_history not in ("field", "inline", "drop"):
            raise ValueError(f"reasoning_history must be 'field', 'inline' or 'drop', got {reasoning_history!r}")
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
        self.token_ids = token_ids
        self.reasoning_history = reasoning_history
        self._proxy = _env_proxy(base_url)
        self.requests_sent = 0  # HTTP attempts, for tests and summaries
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = weakref.WeakKeyDictionary()

    @property
    def sampling(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.model, "temperature": self.temperature, "top_p": self.top_p,
                             "max_tokens": self.max_tokens, "seed": self.seed, "logprobs": self.logprobs}
        if self.token_ids:
            d["token_ids"] = True
        if self.reasoning_history != "field":
            d["reasoning_history"] = self.reasoning_history
        if self.extra_body:
            d["extra_body"] = self.extra_body
        return {k: v for k, v in d.items() if v is not None}

    def _ensure(self) -> tuple[Any, asyncio.Semaphore]:
        """This event loop's HTTP session and semaphore (each loop gets its own: asyncio objects are loop-bound)."""
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            import aiohttp

            headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json",
                       "Accept": "application/json", "User-Agent": "flywheel"}
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.concurrency), headers=headers)
            state = self._per_loop[loop] = [session, asyncio.Semaphore(self.concurrency), 0]
        return state[0], state[1]

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[OpenAIPolicy]:
        """Scope of this loop's HTTP session: closed when the last open session of the loop ends (the rollout
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
                await state[0].close()

    async def aclose(self) -> None:
        """Close the running loop's HTTP session (sessions do this for you)."""
        state = self._per_loop.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state[0].close()

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_max_s) + random.uniform(0, 0.1 * min(retry_after, 1.0))
        return min(self.backoff_max_s, self.backoff_base_s * 2 ** attempt) * random.uniform(0.5, 1.0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]], sample_index: int) -> dict[str, Any]:
        """The JSON body of one chat-completions request (extra_body merged in, as the SDK merges it)."""
        kw: dict[str, Any] = {"model": self.model,
                              "messages": chat.to_openai(messages, reasoning=self.reasoning_history)}
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
        if self.token_ids:
            kw["return_token_ids"] = True
        if self.extra_body:
            kw.update(self.extra_body)
        return kw

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        import aiohttp

        session, sem = self._ensure()
        url = self.base_url.rstrip("/") + "/chat/completions"
        body = json.dumps(self._request(messages, tools, sample_index), ensure_ascii=False).encode()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                async with sem:
                    self.requests_sent += 1
                    async with session.post(url, data=body, timeout=timeout, proxy=self._proxy) as resp:
                        status, headers, raw = resp.status, resp.headers, await resp.read()
            except TimeoutError:  # aiohttp's timeouts are TimeoutErrors (asyncio.TimeoutError is the same class)
                last = f"no answer within {self.timeout_s:g} s (timeout_s)"
            except aiohttp.ClientError as e:  # refused, reset, dropped mid-response, malformed HTTP
                last = f"connection failed: {type(e).__name__}: {e}"
            else:
                if status < 300:
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        data = None
                    if isinstance(data, dict):
                        return self._to_reply(data, turn=len(messages))
                    last = f"HTTP {status} with a body that is not a JSON object: {raw[:200]!r}"
                else:
                    text = _error_text(raw)
                    if status in (400, 413) and is_context_length_message(text):
                        raise ContextLengthError(f"{self.base_url} model {self.model!r}: context too long "
                                                 f"(HTTP {status}): {text[:300]}")
                    if status not in RETRY_STATUSES:
                        raise RequestRejected(f"{self.base_url} rejected the request with HTTP {status}: "
                                              f"{text[:300]}; fix: "
                                              f"{_status_fix(status, self.base_url, self.model, self.api_key_env)}")
                    retry_after = retry_after_seconds(headers)
                    last = f"HTTP {status}: {text[:200]}"
            if attempt < self.max_retries:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        raise EndpointError(f"{self.base_url} model {self.model!r} failed after {self.max_retries + 1} attempts "
                            f"(last: {last}); fix: check the server is up and not overloaded, or raise "
                            "max_retries / timeout_s")

    def _to_reply(self, resp: dict[str, Any], *, turn: int) -> PolicyReply:
        """A chat-completions response (parsed JSON) to the conversation's `turn`-th message -> PolicyReply;
        ModelError when it is not one."""
        choices = resp.get("choices")
        if not choices or not isinstance(choices, list):
            raise ModelError(f"{self.base_url} returned no choices")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise ModelError(f"{self.base_url} returned a choice without a message")
        try:
            message = chat.from_chat({**choice["message"], "role": "assistant"}, turn=turn,
                                     text_tool_calls=self.text_tool_calls)
            usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else {}
            pt = int(usage.get("prompt_tokens") or 0)
            ct = int(usage.get("completion_tokens") or 0)
            logprobs, ids = _logprobs_and_ids(choice)
            prompt_ids = resp.get("prompt_token_ids")
            prompt_ids = [int(x) for x in prompt_ids] if isinstance(prompt_ids, list) else None
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # right JSON, wrong shapes inside
            raise ModelError(f"{self.base_url} returned a malformed choice: {type(e).__name__}: {e}") from None
        finish = choice.get("finish_reason")
        served = resp.get("model") if isinstance(resp.get("model"), str) else self.model
        fingerprint = resp.get("system_fingerprint")
        return PolicyReply(message=message, prompt_tokens=pt, completion_tokens=ct,
                           cost_usd=cost_usd(pt, ct, self.prompt_price_per_1m, self.completion_price_per_1m),
                           finish_reason=finish if isinstance(finish, str) else None, token_ids=ids,
                           logprobs=logprobs, prompt_token_ids=prompt_ids,
                           model_version=f"{served}@{fingerprint}" if isinstance(fingerprint, str) and fingerprint
                           else served)


def _env_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY / NO_PROXY give for url, read once (as the openai SDK honours them). Not aiohttp's
    trust_env: it reads the environment and ~/.netrc on every request, 0.3 ms of CPU each, more than the rest of
    our request."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _error_text(raw: bytes) -> str:
    """The message of an error response body: OpenAI's {"error": {"message": ...}}, any JSON, or the text."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("code") or err)
        return str(err)
    return str(body)


# ---------------------------------------------------------------------------------------------------- preflight


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
