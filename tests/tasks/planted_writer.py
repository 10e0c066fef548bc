"""A TEST DOUBLE: an OpenAI-compatible task writer on 127.0.0.1 that answers with planted proposals.

A real HTTP/1.1 server (http.server, a thread per connection) with `GET /v1/models` and `POST /v1/chat/completions`.
Request i of `flywheel tasks synthesize --writer openai --seed 0` carries `seed` i (the client adds the sample
index to its seed), and is answered with PROPOSALS[i] as the message content, with usage 100 + i prompt tokens and
50 completion tokens. Each proposal is planted to meet one admission check (see PROPOSALS and EXPECTED).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

LOG = "".join(f"{i:03d} {'ERROR disk full' if i % 3 == 0 else 'INFO ok'}\n" for i in range(1, 40))  # 13 ERROR
TEST_HEAD = "#!/bin/bash\nmkdir -p /logs/verifier\n"
PASS_IF = 'if {cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'
COUNT_IS_13 = '[ "$(tr -d "[:space:]" < /app/errors.txt 2>/dev/null)" = "13" ]'
COIN = '[ "$(od -An -N1 -tu1 /dev/urandom | tr -d " ")" -lt 8 ]'  # true 1 time in 32


def _errors_task(name: str, *, solve: str = "grep -c ERROR /app/logs/app.log > /app/errors.txt",
                 cond: str = COUNT_IS_13, instruction: str | None = None) -> dict[str, Any]:
    return {"name": name,
            "instruction": instruction or "Count the lines of `/app/logs/app.log` that contain `ERROR` and write "
                                          "the count, just the number, to `/app/errors.txt`.",
            "files": {"logs/app.log": LOG}, "test_sh": TEST_HEAD + PASS_IF.format(cond=cond),
            "solve_sh": f"#!/bin/bash\n{solve}\n"}


def _heldout_copy(harbor_task: Path) -> dict[str, Any]:
    """The held-out task's own folder as a proposal (instruction without its canary line)."""
    instr = [line for line in (harbor_task / "instruction.md").read_text().splitlines() if "canary" not in line]
    files = {p.relative_to(harbor_task / "environment" / "files").as_posix(): p.read_text()
             for p in sorted((harbor_task / "environment" / "files").rglob("*")) if p.is_file()}
    return {"name": "sum-the-sales", "instruction": "\n".join(instr).strip(), "files": files,
            "test_sh": (harbor_task / "tests" / "test.sh").read_text(),
            "test_files": {"check.py": (harbor_task / "tests" / "check.py").read_text()},
            "solve_sh": (harbor_task / "solution" / "solve.sh").read_text()}


def proposals(heldout_task: Path) -> list[str]:
    """The replies, in request order; EXPECTED[i] is what admission must make of reply i."""
    return [
        json.dumps(_errors_task("count-error-lines")),
        json.dumps(_errors_task("count-error-lines-wrong", solve="grep -c INFO /app/logs/app.log > /app/errors.txt")),
        json.dumps(_errors_task("count-error-lines-lenient", cond="true")),
        json.dumps(_errors_task("count-error-lines-coin", cond=f"{COUNT_IS_13} && {COIN}")),
        json.dumps({"name": "sum-numbers", "instruction": "Write the sum of the numbers in `/app/nums.txt` to "
                    "`/app/sum.txt`. (It is 4711.)", "files": {"nums.txt": "4700\n11\n"},
                    "test_sh": TEST_HEAD + PASS_IF.format(cond='[ "$(cat /app/sum.txt)" = "4711" ]'),
                    "solve_sh": "#!/bin/bash\nawk '{s+=$1} END {print s}' /app/nums.txt > /app/sum.txt\n"}),
        "```json\n" + json.dumps(_heldout_copy(heldout_task)) + "\n```",
        'Sure! Here is a new task: {"name": "oops", "instruction": ',
    ]


class PlantedWriter:
    """The server; `url` is its /v1 base URL; `requests` the parsed request bodies."""

    def __init__(self, replies: list[str]):
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "planted", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                i = int(body.get("seed", 0))
                if self.path.rstrip("/") != "/v1/chat/completions" or not 0 <= i < len(outer.replies):
                    self._send(400, {"error": {"message": f"no planted reply for seed {i}"}})
                    return
                self._send(200, {"id": f"cmpl-{i}", "object": "chat.completion", "model": "planted",
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": outer.replies[i]}}],
                                 "usage": {"prompt_tokens": 100 + i, "completion_tokens": 50,
                                           "total_tokens": 150 + i}})

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
