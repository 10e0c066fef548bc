"""Optional LLM-judge verifier over an OpenAI-compatible chat endpoint, for tasks with no programmatic check.

The judge sees the task's prompt, its rubric and the episode's final assistant message, and must end its reply with
`VERDICT: PASS` or `VERDICT: FAIL`. Anything else is a failure (fail-closed). An endpoint that cannot answer after
bounded retries raises VerifierUnavailable (infra_error, retried), never a score. The judge never judges code or
math alone: the task spec forbids kind='llm_judge' on tasks with an expected answer or tests.
This module holds no reward logic.
"""

from __future__ import annotations

import os
import re
import time

from pydantic import BaseModel, Field

from tasks.judge.errors import VerifierUnavailable
from tasks.spec import Task
from warehouse.record import Message

JUDGE_VERSION = "1"
VERDICT_RE = re.compile(r"VERDICT:\s*(PASS|FAIL)\b", re.IGNORECASE)
SYSTEM = ("You grade an assistant's final answer against a task and a rubric. Think briefly, then end with exactly "
          "one line: 'VERDICT: PASS' or 'VERDICT: FAIL'.")


class JudgeConfig(BaseModel):
    """Where the judge model is served and how to call it."""

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Model name the endpoint serves.")
    api_key_env: str | None = Field(default=None, description="Environment variable holding the API key, if any.")
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one HTTP request.")
    max_retries: int = Field(default=2, ge=0, description="Retries on connection errors, 408, 429 and 5xx.")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature of the judge.")


class JudgeResult(BaseModel):
    passed: bool
    reply: str
    error: str | None = None


def judge(task: Task, messages: list[Message], config: JudgeConfig) -> JudgeResult:
    final = next((m.content for m in reversed(messages) if m.role == "assistant" and m.content), None)
    if not final:
        return JudgeResult(passed=False, reply="", error="the episode has no final assistant message")
    rubric = task.verifier.rubric or "The answer fully and correctly does what the task asks."
    body = {"model": config.model, "temperature": config.temperature, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task:\n{task.prompt}\n\nRubric:\n{rubric}\n\nAssistant's final answer:\n{final}"},
    ]}
    headers = {}
    if config.api_key_env:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise VerifierUnavailable(f"judge API key variable {config.api_key_env} is not set; export it")
        headers["Authorization"] = f"Bearer {key}"
    import httpx  # here, not at the top: every CLI command imports this module through the config (0.4 s)

    url = config.base_url.rstrip("/") + "/chat/completions"
    last_err = ""
    for attempt in range(config.max_retries + 1):
        try:
            r = httpx.post(url, json=body, headers=headers, timeout=config.timeout_s)
        except httpx.HTTPError as e:
            last_err = f"{type(e).__name__}: {e}"
        else:
            if r.status_code == 200:
                try:
                    reply = r.json()["choices"][0]["message"]["content"] or ""
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    return JudgeResult(passed=False, reply=r.text[:500], error=f"malformed judge response: {e}")
                found = VERDICT_RE.findall(reply)
                if not found:
                    return JudgeResult(passed=False, reply=reply, error="the judge gave no VERDICT line")
                return JudgeResult(passed=found[-1].upper() == "PASS", reply=reply)
            last_err = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code not in (408, 409, 429) and r.status_code < 500:
                raise VerifierUnavailable(f"judge endpoint {url} refused the request ({last_err}); check model "
                                          "name and key")
        if attempt < config.max_retries:
            time.sleep(min(4.0, 0.5 * 2 ** attempt))
    raise VerifierUnavailable(f"judge endpoint {url} did not answer after {config.max_retries + 1} tries: {last_err}")
