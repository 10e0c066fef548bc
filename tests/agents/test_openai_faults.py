"""The OpenAI-compatible policy against a fault-injecting server on 127.0.0.1 (fast: no sandbox needed).

Each fault: the right verdict, bounded retries (requests counted on the server), one row per planned episode
(no duplicates), and the rollout finishes. Episodes here answer without tools (tasks that do not require one) or
end before their first tool call, so the sandbox backend is a double that fails the test if it is ever used.
The same faults with real tool calls in Docker sandboxes are in test_loop_docker.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from agents.openai_policy import OpenAIPolicy, check_endpoint, retry_after_seconds
from agents.policy import EndpointError
from agents.rollout import rollout


def policy(server, model: str, **kw) -> OpenAIPolicy:
    kw.setdefault("max_retries", 3)
    kw.setdefault("backoff_base_s", 0.05)
    kw.setdefault("timeout_s", 5.0)
    return OpenAIPolicy(base_url=server.base_url, model=model, name=kw.pop("name", model.split(":")[0]), **kw)


def run(tasks, pol, backend, **kw):
    rows = []
    kw.setdefault("infra_retries", 0)
    summary = asyncio.run(rollout(tasks, pol, backend, run_id="faults", samples=kw.pop("samples", 1),
                                  concurrency=kw.pop("concurrency", 4), on_rows=rows.extend, batch_size=3,
                                  progress=False, retry_backoff_s=0.05, **kw))
    ids = [r.trajectory_id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate rows"
    assert summary.delivered == len(rows) == summary.episodes
    return summary, rows


def test_ok_direct_answers_pass_with_usage_and_cost(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "direct", prompt_price_per_1m=2.0, completion_price_per_1m=10.0, temperature=0.3)
    summary, rows = run(direct_tasks, pol, no_sandbox, samples=2)
    assert len(rows) == 8 and {r.verdict for r in rows} == {"pass"}
    r = rows[0]
    assert r.prompt_tokens == 50 and r.completion_tokens > 0 and r.turns == 1
    assert r.cost_usd == pytest.approx(50 * 2.0 / 1e6 + r.completion_tokens * 10.0 / 1e6)
    assert r.endpoint == direct_server.base_url and r.policy == "direct" and r.source == "teacher"
    assert '"temperature": 0.3' in r.sampling_json and '"model": "direct"' in r.sampling_json
    assert direct_server.count("direct") == 8 and no_sandbox.acquired == 0
    assert summary.by_policy["direct"].yield_rate == 1.0


def test_429_with_retry_after_is_honoured_and_bounded(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "ratelimit:2:1")
    t0 = time.monotonic()
    _, rows = run(direct_tasks[:2], pol, no_sandbox)
    assert [r.verdict for r in rows] == ["pass", "pass"]
    assert time.monotonic() - t0 >= 2.0, "Retry-After: 1 twice was not honoured"
    assert direct_server.count("ratelimit:2:1", "429") == 4 and direct_server.count("ratelimit:2:1", "ok") == 2
    # the wait between two attempts of one conversation is at least Retry-After
    for conv in {r["conv"] for r in direct_server.requests}:
        ts = [r["t"] for r in direct_server.requests if r["conv"] == conv]
        assert all(b - a >= 0.95 for a, b in itertools.pairwise(ts))


@pytest.mark.parametrize("model,fault", [("e500:3", "500"), ("e503:2", "503")])
def test_5xx_bursts_are_retried(direct_server, direct_tasks, no_sandbox, model, fault):
    pol = policy(direct_server, model, max_retries=3)
    _, rows = run(direct_tasks, pol, no_sandbox)
    assert {r.verdict for r in rows} == {"pass"} and len(rows) == 4
    n = int(model.split(":")[1])
    assert direct_server.count(model, fault) == 4 * n and direct_server.count(model, "ok") == 4


def test_slow_responses_time_out_then_succeed(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "slow:1:3", timeout_s=0.5, max_retries=2)
    t0 = time.monotonic()
    _, rows = run(direct_tasks[:2], pol, no_sandbox)
    assert [r.verdict for r in rows] == ["pass", "pass"]
    assert time.monotonic() - t0 < 2.9, "the client waited for the slow answer instead of timing out"
    assert direct_server.count("slow:1:3", "slow") == 2 and direct_server.count("slow:1:3", "ok") == 2


def test_dropped_connections_are_retried(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "drop:2")
    _, rows = run(direct_tasks, pol, no_sandbox)
    assert {r.verdict for r in rows} == {"pass"}
    assert direct_server.count("drop:2", "drop") == 8 and direct_server.count("drop:2", "ok") == 4


def test_unreadable_2xx_bodies_are_retried(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "garbage:2")
    _, rows = run(direct_tasks[:2], pol, no_sandbox)
    assert [r.verdict for r in rows] == ["pass", "pass"]
    assert direct_server.count("garbage:2", "garbage") == 4 and direct_server.count("garbage:2", "ok") == 2


def test_a_completion_without_choices_is_model_error_not_retried(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "nochoice")
    _, rows = run(direct_tasks[:2], pol, no_sandbox, infra_retries=2)
    assert [r.verdict for r in rows] == ["model_error", "model_error"]
    assert "returned no choices" in rows[0].error_message
    assert direct_server.count("nochoice") == 2


def test_endless_5xx_is_infra_error_with_bounded_retries(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "always500", max_retries=2)
    summary, rows = run(direct_tasks[:2], pol, no_sandbox, infra_retries=1)
    assert [r.verdict for r in rows] == ["infra_error", "infra_error"]
    assert all(r.reward == 0 and not r.success and r.error_class == "EndpointError" for r in rows)
    assert "failed after 3 attempts" in rows[0].error_message
    # (max_retries + 1) requests per episode attempt, (infra_retries + 1) episode attempts, 2 episodes
    assert direct_server.count("always500") == 3 * 2 * 2
    assert summary.retries == 2 and summary.by_policy["always500"].scored == 0


def test_context_length_400_is_model_error_not_retried(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "context")
    _, rows = run(direct_tasks, pol, no_sandbox, infra_retries=2)
    assert {r.verdict for r in rows} == {"model_error"}
    assert {r.error_class for r in rows} == {"ContextLengthError"}
    assert direct_server.count("context") == 4


def test_401_is_rejected_once_and_not_retried(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "reject401")
    _, rows = run(direct_tasks[:2], pol, no_sandbox, infra_retries=3)
    assert {r.verdict for r in rows} == {"infra_error"} and {r.error_class for r in rows} == {"RequestRejected"}
    assert "API key" in rows[0].error_message
    assert direct_server.count("reject401") == 2


@pytest.mark.parametrize("model", ["badjson", "unknowntool"])
def test_malformed_tool_calls_are_model_error_rows(server, tasks4, no_sandbox, model):
    pol = policy(server, model)
    _, rows = run(tasks4, pol, no_sandbox)
    assert {r.verdict for r in rows} == {"model_error"} and {r.error_class for r in rows} == {"ToolArgumentError"}
    assert server.count(model) == 4 and no_sandbox.acquired == 0
    last = rows[0].messages[-1]
    assert last.role == "tool" and last.content.startswith("error:") and last.tool_call_id == "call_0"
    assert rows[0].n_tool_calls == 1 and rows[0].turns == 1


def test_resume_skips_written_ids(direct_server, direct_tasks, no_sandbox):
    pol = policy(direct_server, "direct")
    _, first = run(direct_tasks[:2], pol, no_sandbox, samples=2)
    summary, rest = run(direct_tasks, pol, no_sandbox, samples=2, skip_ids={r.trajectory_id for r in first})
    assert summary.skipped == 4 and len(rest) == 4
    assert not {r.trajectory_id for r in first} & {r.trajectory_id for r in rest}
    assert direct_server.count("direct") == 8


def test_check_endpoint(server):
    assert check_endpoint(server.base_url, "ok") == ["ok"]
    with pytest.raises(EndpointError, match="does not serve model 'nope'"):
        check_endpoint(server.base_url, "nope")
    with pytest.raises(EndpointError, match=r"cannot reach .*127\.0\.0\.1:9/v1.*fix"):
        check_endpoint("http://127.0.0.1:9/v1", "ok", timeout=1.0)


def test_retry_after_parsing():
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_proxy_from_the_environment_read_once(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.9:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    assert OpenAIPolicy(base_url="https://api.example.com/v1", model="m")._proxy == "http://127.0.0.9:3128"
    assert OpenAIPolicy(base_url="https://internal.example/v1", model="m")._proxy is None
    monkeypatch.delenv("HTTPS_PROXY")
    assert OpenAIPolicy(base_url="https://api.example.com/v1", model="m")._proxy is None
