"""A fault-injecting OpenAI-compatible HTTP server on 127.0.0.1 -- a TEST DOUBLE for policy fault tests.

It is a real HTTP/1.1 server (http.server, one thread per connection, keep-alive) that answers
`POST /v1/chat/completions` and `GET /v1/models`. Its "model" is a scripted agent: for a task prompt it knows
(`solutions`: prompt -> python code, or {"tool": NAME, "arguments": {...}} for another tool), it makes `tool_turns`
python tool calls with that code (calls of that tool), then answers
"Answer: <last tool output>". Without a known prompt it answers "Answer: <direct[prompt]>" directly.

The request's `model` field picks the behaviour, `NAME[:ARG[:ARG]]`; a fault applies to the first N attempts of each
(conversation, turn) -- a conversation is keyed by its first user message, a turn by the number of assistant messages
in the request -- so retries of the same request see the fault end:
  ok                        normal answers
  direct                    answer at once without tools ("Answer: " + direct[prompt])
  ratelimit:N:SECONDS       429 with Retry-After: SECONDS
  e500:N / e503:N           500 / 503 with a JSON error body
  slow:N:SECONDS            sleep SECONDS before answering (past the client's timeout)
  drop:N                    close the connection without an answer
  garbage:N                 200 with a body that is not JSON (a proxy's error page, a cut-off body)
  nochoice                  200 with a JSON completion whose `choices` is empty
  always500                 500 forever
  badjson                   a tool call whose arguments are not valid JSON
  unknowntool               a tool call to a tool no task offers ("rm_rf")
  context                   400 "maximum context length" (vLLM's wording)
  reject401                 401 invalid API key
  text                      the tool call as <tool_call>{...}</tool_call> text in content, no tool_calls field
  logprobs                  normal answers plus logprobs (tokens "token_id:N") and choice token_ids
  latency:SECONDS[:TURNS[:JITTER]]  sleep SECONDS on every request; TURNS assistant turns per episode (TURNS-1 tool
                            calls); with JITTER (a fraction), SECONDS x (1 + JITTER x u), u uniform in [-1, 1] and
                            fixed per (conversation, turn): the mean stays SECONDS, as a real server's latency varies

With `tokenizer_dir` (a model folder whose chat template writes Hermes `<tool_call>` blocks, e.g. the tiny student)
it answers as `vllm serve --reasoning-parser deepseek_r1 --tool-call-parser hermes` does over that tokenizer: the
scripted reply is model text (`<think>{reasoning}</think>` when `reasoning` is set, then the content or the
`<tool_call>` block, then the stop token; for a template that renders reasoning itself, Qwen3's or GPT-OSS's
harmony, the text the template renders for the reply with reasoning in its field, and `reasoning_content` of the
request's messages handed to harmony's `thinking`, as vLLM's harmony renderer takes it; `reasoning_on_calls=False`:
reasoning on the final answer only), split into the message's `reasoning` (and its deprecated copy
`reasoning_content`), `content` and `tool_calls`; with `return_token_ids` in the request the response carries the
prompt's token ids (the request's messages rendered by the chat template, tool-call arguments decoded and
`reasoning_content` handed to the template, as vLLM does) at the top level and the completion's in
`choices[0].token_ids` (stop token included); with `logprobs`, one entry per completion token.
Every request is recorded in `requests` (model, conversation, turn, attempt, what was done) for assertions.
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

END_OF_TURN = ("<|im_end|>", "<|call|>", "<|return|>")
CONTEXT_MESSAGE = ("This model's maximum context length is 64 tokens. However, you requested 900 tokens "
                   "(836 in the messages, 64 in the completion). Please reduce the length of the messages.")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True


class FaultServer:
    """Start with `with FaultServer(solutions=...) as srv:`; `srv.base_url` ends in /v1."""

    def __init__(self, solutions: dict[str, Any] | None = None, direct: dict[str, str] | None = None,
                 tool_turns: int = 1, models: list[str] | None = None, tokenizer_dir: str | None = None,
                 reasoning: str | None = None, reasoning_on_calls: bool = True) -> None:
        self.tokenizer = None
        self._field: str | None = None
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
            from warehouse import chat

            template = self.tokenizer.chat_template
            # where the template reads reasoning: harmony's `thinking`, Qwen3's `reasoning_content`, or None
            # (the default tiny student's template has none: the reply is hand-written Hermes text)
            self._field = "thinking" if chat.dialect_of(template) == "harmony" else chat.reasoning_key(template)
        self.reasoning = reasoning
        self.reasoning_on_calls = reasoning_on_calls
        self.solutions = dict(solutions or {})
        self.direct = dict(direct or {})
        self.tool_turns = tool_turns
        self.models = models or ["ok"]
        self.requests: list[dict[str, Any]] = []
        self._attempts: dict[tuple[str, str, int], int] = {}
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY, as real servers (uvicorn) set it: http.server writes the headers and the body in two
            # sends, and with Nagle's algorithm the body waits for the client's delayed ACK (~40 ms per response).
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/stats":
                    with owner._lock:
                        by_model = dict(collections.Counter(r["model"] for r in owner.requests))
                    self._json(200, {"requests": sum(by_model.values()), "by_model": by_model})
                elif self.path.rstrip("/") == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in owner.models]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                owner._handle(self, body)

            def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer to

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def count(self, model: str | None = None, action: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if (model is None or r["model"] == model) and (action is None or r["action"] == action))

    # -- behaviour
    def _handle(self, h: Any, body: dict[str, Any]) -> None:
        model = str(body.get("model", "ok"))
        kind, *args = model.split(":")
        messages = body.get("messages", [])
        prompt = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        conv = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        with self._lock:
            key = (model, conv, turn)
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1

        def record(action: str) -> None:
            with self._lock:
                self.requests.append({"model": model, "conv": conv, "turn": turn, "attempt": attempt,
                                      "action": action, "t": time.monotonic()})

        n_fault = int(args[0]) if args and args[0].isdigit() else 0
        faulty = attempt < n_fault
        if kind == "ratelimit" and faulty:
            record("429")
            h._json(429, {"error": {"message": "rate limited", "type": "rate_limit"}},
                    {"retry-after": args[1] if len(args) > 1 else "1"})
            return
        if kind in ("e500", "e503") and faulty:
            record(kind[1:])
            h._json(int(kind[1:]), {"error": {"message": f"injected {kind[1:]}"}})
            return
        if kind == "always500":
            record("500")
            h._json(500, {"error": {"message": "injected 500 (always)"}})
            return
        if kind == "drop" and faulty:
            record("drop")
            h.close_connection = True
            try:
                import socket

                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if kind == "garbage" and faulty:
            record("garbage")
            try:
                h.send_response(200)
                h.send_header("content-type", "text/html")
                h.send_header("content-length", "21")
                h.end_headers()
                h.wfile.write(b"<html>gateway</html>\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        if kind == "nochoice":
            record("nochoice")
            h._json(200, {"id": "x", "object": "chat.completion", "model": model, "choices": []})
            return
        if kind == "slow" and faulty:
            record("slow")
            time.sleep(float(args[1]) if len(args) > 1 else 5.0)
            h._json(200, self._completion(model, self._message(kind, prompt, messages, turn)))
            return
        if kind == "context":
            record("400")
            h._json(400, {"error": {"message": CONTEXT_MESSAGE, "type": "BadRequestError", "code": 400}})
            return
        if kind == "reject401":
            record("401")
            h._json(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
            return
        if kind == "latency":
            seconds = float(args[0]) if args else 0.2
            if len(args) > 2:
                u = int(hashlib.sha256(f"{conv}:{turn}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF * 2 - 1
                seconds *= 1 + float(args[2]) * u
            time.sleep(seconds)
        record("ok")
        msg = self._message(kind, prompt, messages, turn, args)
        if self.tokenizer is not None:
            h._json(200, self._vllm_completion(model, msg, body))
            return
        h._json(200, self._completion(model, msg, logprobs=kind == "logprobs"))

    def _message(self, kind: str, prompt: str, messages: list[dict[str, Any]], turn: int,
                 args: list[str] | None = None) -> dict[str, Any]:
        tool_turns = self.tool_turns
        if kind == "latency" and args and len(args) > 1:
            tool_turns = int(args[1]) - 1
        if kind == "direct" or prompt not in self.solutions:
            return {"role": "assistant", "content": f"Answer: {self.direct.get(prompt, '0')}"}
        if turn < tool_turns:
            code = self.solutions[prompt]
            arguments = json.dumps({"code": code})
            name = "python"
            if isinstance(code, dict):  # another tool's call: {"tool": name, "arguments": {...}}
                name, arguments = code["tool"], json.dumps(code["arguments"])
            if kind == "badjson":
                arguments = arguments[:-3]
            if kind == "unknowntool":
                name = "rm_rf"
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": arguments}}
            if kind == "text":
                return {"role": "assistant",
                        "content": "<tool_call>\n" + json.dumps({"name": name, "arguments": {"code": code}})
                                   + "\n</tool_call>"}
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        last_tool = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "tool"), "")
        return {"role": "assistant", "content": f"The tool printed {last_tool.strip()}.\nAnswer: {last_tool.strip()}"}

    def _completion(self, model: str, msg: dict[str, Any], *, logprobs: bool = False) -> dict[str, Any]:
        text = json.dumps(msg)
        ct = 7 + len(text) // 16
        choice: dict[str, Any] = {"index": 0, "message": msg,
                                  "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}
        if logprobs:
            ids = [100 + i for i in range(ct)]
            choice["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": -0.1 * (k + 1), "bytes": None,
                                               "top_logprobs": []} for k, i in enumerate(ids)]}
            choice["token_ids"] = ids
        return {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [choice], "usage": {"prompt_tokens": 50, "completion_tokens": ct,
                                               "total_tokens": 50 + ct}}


    def _templated_completion(self, tools: Any, msg: dict[str, Any]) -> list[int]:
        """The completion ids of a model that writes exactly what its chat template renders for `msg` (reasoning
        in the template's field): the render after a user turn minus the generation prompt, up to its first end
        of turn. (After a user turn, not after the history: GPT-OSS's template drops the analysis of earlier
        tool-call turns once a final answer follows, so the history's render would not be a prefix.)"""
        tok = self.tokenizer
        history = [{"role": "user", "content": "?"}]
        turn: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            turn["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in msg["tool_calls"]]
        if self.reasoning and (self.reasoning_on_calls or not msg.get("tool_calls")):
            turn[self._field] = self.reasoning
        prompt = tok.apply_chat_template(history, tools=tools, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(history + [turn], tools=tools, tokenize=False)
        assert full.startswith(prompt), "the template does not extend the generation prompt with the reply"
        text = full[len(prompt):]
        end = min((text.index(t) + len(t) for t in END_OF_TURN if t in text), default=len(text))
        return list(tok(text[:end], add_special_tokens=False)["input_ids"])

    def _vllm_completion(self, model: str, msg: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """The scripted reply as vLLM serves it over a real tokenizer (see the module docstring)."""
        tok = self.tokenizer
        history = []
        for m in body.get("messages", []):
            m = dict(m)
            if m.get("tool_calls"):  # vLLM decodes arguments for the template
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                    c["function"]["arguments"])}} for c in m["tool_calls"]]
            if m.get("content") is None:
                m["content"] = ""
            if self._field == "thinking" and "reasoning_content" in m:  # harmony: the analysis channel
                m["thinking"] = m.pop("reasoning_content")
            history.append(m)
        prompt_ids = list(tok.apply_chat_template(history, tools=body.get("tools") or None, tokenize=True,
                                                  add_generation_prompt=True, return_dict=True)["input_ids"])
        calls = msg.get("tool_calls") or []
        if self._field is None:
            text = f"<think>\n{self.reasoning}\n</think>" if self.reasoning and (
                self.reasoning_on_calls or not calls) else ""
            if msg.get("content"):
                text += ("\n\n" if text else "") + msg["content"]
            for c in calls:
                block = json.dumps({"name": c["function"]["name"],
                                    "arguments": json.loads(c["function"]["arguments"])}, ensure_ascii=False)
                text += ("\n" if text else "") + f"<tool_call>\n{block}\n</tool_call>"
            ids = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids("<|im_end|>")]
        else:
            ids = self._templated_completion(body.get("tools") or None, msg)
        out: dict[str, Any] = {"role": "assistant", "content": msg.get("content"), "tool_calls": calls or None}
        if self.reasoning and (self.reasoning_on_calls or not calls):
            out["reasoning"] = out["reasoning_content"] = self.reasoning
        choice: dict[str, Any] = {"index": 0, "message": out, "finish_reason": "tool_calls" if calls else "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": tok.decode([i]), "logprob": -0.05, "bytes": None,
                                               "top_logprobs": []} for i in ids]}
        resp: dict[str, Any] = {"id": "chatcmpl-vllm", "object": "chat.completion", "created": int(time.time()),
                                "model": model, "choices": [choice],
                                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                                          "total_tokens": len(prompt_ids) + len(ids)}}
        if body.get("return_token_ids"):
            resp["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        return resp


def main() -> None:
    """Serve in a process of its own (the benchmark does this so that the server's threads do not share the
    client's interpreter): `python fault_server.py SPEC.json` where SPEC holds solutions, direct, tool_turns and
    models. Prints `URL <base_url>` once listening; stops when stdin closes. GET /v1/stats returns request counts."""
    import sys

    spec = {}
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            spec = json.load(f)
    srv = FaultServer(solutions=spec.get("solutions"), direct=spec.get("direct"),
                      tool_turns=spec.get("tool_turns", 1), models=spec.get("models"))
    srv.start()
    print("URL", srv.base_url, flush=True)
    try:
        sys.stdin.read()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
