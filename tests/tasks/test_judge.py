"""The LLM-judge verifier against a real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions shape:
PASS/FAIL parsed, no verdict line fails closed, 5xx retried, a dead endpoint is VerifierUnavailable."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tasks.judge.errors import VerifierUnavailable
from tasks.judge.llm import JudgeConfig
from tasks.judge.verify import verify
from tasks.spec import ReferenceSolution, Task, VerifierSpec
from warehouse.record import Message


class Server:
    """Serves queued (status, reply text) answers in order; records each request body."""

    def __init__(self):
        self.answers: list[tuple[int, str]] = []
        self.requests: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status, text = outer.answers.pop(0) if outer.answers else (500, "empty")
                payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}) \
                    if status == 200 else text
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload.encode())

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()


TASK = Task(id="poem", suite="open", version="1", split="train", prompt="Write a haiku about rain.", tools=[],
            verifier=VerifierSpec(kind="llm_judge", rubric="Three lines, 5-7-5 syllables, about rain."),
            reference=ReferenceSolution(final="Soft rain on the roof..."))
EP = [Message(role="user", content=TASK.prompt), Message(role="assistant", content="Rain taps the window")]


def cfg(url: str, **kw) -> JudgeConfig:
    return JudgeConfig(base_url=url, model="judge-1", max_retries=1, timeout_s=5, **kw)


def test_pass_and_fail(server):
    server.answers = [(200, "Good form.\nVERDICT: PASS"), (200, "VERDICT: PASS? no.\nVERDICT: FAIL")]
    assert verify(TASK, EP, judge_config=cfg(server.url)).verdict == "pass"
    assert verify(TASK, EP, judge_config=cfg(server.url)).verdict == "fail"
    body = server.requests[0]["body"]
    assert server.requests[0]["path"] == "/v1/chat/completions" and body["model"] == "judge-1"
    assert "Three lines" in body["messages"][1]["content"] and "Rain taps" in body["messages"][1]["content"]


def test_no_verdict_fails_closed(server):
    server.answers = [(200, "Looks fine to me!")]
    o = verify(TASK, EP, judge_config=cfg(server.url))
    assert o.verdict == "fail" and "no VERDICT" in o.details["error"]


def test_5xx_is_retried_then_unavailable(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    server.answers = [(503, "busy"), (200, "VERDICT: PASS")]
    assert verify(TASK, EP, judge_config=cfg(server.url, api_key_env="JUDGE_KEY")).verdict == "pass"
    assert server.requests[-1]["auth"] == "Bearer sk-test"
    server.answers = [(500, "down"), (500, "down")]
    with pytest.raises(VerifierUnavailable, match="did not answer after 2 tries"):
        verify(TASK, EP, judge_config=cfg(server.url))
    server.answers = [(400, "bad model")]
    with pytest.raises(VerifierUnavailable, match="refused"):
        verify(TASK, EP, judge_config=cfg(server.url))


def test_dead_endpoint_and_missing_config():
    with pytest.raises(VerifierUnavailable):
        verify(TASK, EP, judge_config=JudgeConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0))
    with pytest.raises(VerifierUnavailable, match="judge_config"):
        verify(TASK, EP)
