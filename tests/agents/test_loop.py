"""The episode loop, the reference teacher's noise draws, mixtures and configs -- fast tests with no sandbox.

Sandbox failures are injected with backend doubles named as such; the loop with real Docker sandboxes is in
test_loop_docker.py.
"""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from agents.config import MixtureConfig, PolicyConfig, build_policy, check_policy
from agents.loop import initial_messages, run_episode
from agents.mixture import Mixture, mixture_from_config
from agents.policy import EndpointError, PolicyReply, PolicySetupError
from agents.reference import ReferenceNoise, ReferencePolicy
from agents.rollout import plan, rollout, summary_table
from sandbox.result import SandboxUnavailable
from tasks import arithmetic
from warehouse.record import FunctionCall, Message, ToolCall, trajectory_id


class BrokenBackend:
    """TEST DOUBLE: a sandbox backend whose engine is gone (acquire raises SandboxUnavailable)."""

    name = "docker"
    image = "flywheel-sandbox:bookworm"

    def __init__(self) -> None:
        self.calls = 0

    def acquire(self):
        self.calls += 1
        raise SandboxUnavailable("no Docker engine answers; fix: start dockerd")

    def shutdown(self) -> None:
        pass


class ScriptedPolicy:
    """TEST DOUBLE: a policy that replays a fixed list of replies or raises the given exceptions."""

    source = "teacher"
    endpoint = "scripted://"

    def __init__(self, name: str, script: list) -> None:
        self.name = name
        self.script = script
        self.sampling = {"temperature": 0.0}
        self.calls = 0

    async def reply(self, messages, tools, *, task, sample_index):
        item = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(item, BaseException):
            raise item
        return item


def tool_reply(i: int = 0) -> PolicyReply:
    call = ToolCall(id=f"c{i}", function=FunctionCall(name="python", arguments=json.dumps({"code": "print(1)"})))
    return PolicyReply(message=Message(role="assistant", tool_calls=[call]), prompt_tokens=10, completion_tokens=5,
                       token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3])


def episode(task, pol, backend, **kw):
    return asyncio.run(run_episode(task, pol, backend, run_id="r", round=1, sample_index=3, **kw))


def test_initial_messages_and_direct_answer(direct_tasks, no_sandbox):
    t = direct_tasks[0]
    msgs = initial_messages(t)
    assert [m.role for m in msgs] == ["system", "user"] and "Answer: <number>" in msgs[0].content
    pol = ReferencePolicy(noise=ReferenceNoise(no_tool=1.0))
    row = episode(t, pol, no_sandbox)
    assert row.verdict == "pass" and row.reward == 1.0 and row.success and row.turns == 1 and row.n_tool_calls == 0
    assert row.trajectory_id == trajectory_id("r", 1, t.id, "reference", 3)
    assert row.source == "teacher" and row.policy == "reference" and row.sandbox_backend == "none"
    assert row.verifier == "numeric" and row.answer == t.verifier.answer
    assert json.loads(row.sampling_json)["noise"]["no_tool"] == 1.0
    assert no_sandbox.acquired == 0


def test_sandbox_unavailable_is_infra_error(tasks4):
    backend = BrokenBackend()
    row = episode(tasks4[0], ReferencePolicy(), backend)
    assert row.verdict == "infra_error" and row.error_class == "SandboxUnavailable"
    assert row.reward == 0 and not row.success and "start dockerd" in row.error_message
    assert row.sandbox_backend == "docker" and row.sandbox_image == "flywheel-sandbox:bookworm"


def test_empty_tool_call_list_is_a_final_message(direct_tasks, no_sandbox):
    reply = PolicyReply(message=Message(role="assistant", content="Answer: 1", tool_calls=[]), prompt_tokens=1)
    row = episode(direct_tasks[0], ScriptedPolicy("chatty", [reply]), no_sandbox, max_turns=2)
    assert row.verdict == "fail" and row.turns == 1 and row.answer == "1"


def test_endpoint_error_and_unexpected_errors_are_infra_rows(tasks4, no_sandbox):
    row = episode(tasks4[0], ScriptedPolicy("down", [EndpointError("http://x/v1 down")]), no_sandbox)
    assert (row.verdict, row.error_class) == ("infra_error", "EndpointError")
    row = episode(tasks4[0], ScriptedPolicy("buggy", [RuntimeError("boom")]), no_sandbox)
    assert (row.verdict, row.error_class, row.error_message) == ("infra_error", "RuntimeError", "boom")
    assert row.endpoint == "scripted://" and json.loads(row.sampling_json) == {"temperature": 0.0}


def test_token_ids_and_logprobs_per_turn(direct_tasks, no_sandbox):
    final = PolicyReply(message=Message(role="assistant", content=f"Answer: {direct_tasks[0].verifier.answer}"),
                        prompt_tokens=7, completion_tokens=3, token_ids=[9, 9], logprobs=[-1.0, -2.0], cost_usd=0.5)
    row = episode(direct_tasks[0], ScriptedPolicy("lp", [final]), no_sandbox)
    assert row.verdict == "pass" and row.completion_token_ids == [[9, 9]] and row.completion_logprobs == [[-1.0, -2.0]]
    assert (row.prompt_tokens, row.completion_tokens, row.cost_usd) == (7, 3, 0.5)


def test_rollout_retries_infra_errors_and_keeps_last_row(tasks4):
    backend = BrokenBackend()
    rows = []
    s = asyncio.run(rollout(tasks4[:2], ReferencePolicy(), backend, run_id="r", samples=2, concurrency=3,
                            infra_retries=2, retry_backoff_s=0.01, on_rows=rows.extend, batch_size=3,
                            progress=False))
    assert backend.calls == 4 * 3 and s.retries == 8 and s.verdicts == {"infra_error": 4}
    assert len(rows) == 4 == len({r.trajectory_id for r in rows})
    assert s.by_policy["reference"].scored == 0 and s.by_policy["reference"].yield_rate == 0.0
    assert "infra_error" in summary_table(s)


def test_rollout_on_rows_failure_stops_the_run(direct_tasks, no_sandbox):
    def broken(rows):
        raise OSError("disk full")

    with pytest.raises(ExceptionGroup) as ei:
        asyncio.run(rollout(direct_tasks, ReferencePolicy(noise=ReferenceNoise(no_tool=1.0)), no_sandbox,
                            run_id="r", on_rows=broken, batch_size=1, progress=False))
    assert ei.group_contains(OSError)


def test_plan_rejects_duplicate_tasks_and_policy_names(tasks4):
    with pytest.raises(ValueError, match="appears twice"):
        plan([tasks4[0], tasks4[0]], ReferencePolicy(), samples=1, run_id="r", round=0)
    with pytest.raises(ValueError, match="unique"):
        plan(tasks4, [ReferencePolicy(), ReferencePolicy()], samples=1, run_id="r", round=0)
    jobs = plan(tasks4, [ReferencePolicy(), ReferencePolicy(name="ref2")], samples=3, run_id="r", round=0)
    assert len(jobs) == 24 and len({j[3] for j in jobs}) == 24


def test_reference_modes_are_deterministic_and_follow_rates():
    tasks = arithmetic.generate(300, split="train", seed=1)
    noise = ReferenceNoise(wrong_answer=0.2, malformed_call=0.1, no_tool=0.1)
    a, b = ReferencePolicy(noise=noise, seed=5), ReferencePolicy(noise=noise, seed=5)
    modes = [a.mode(t, s) for t in tasks for s in range(2)]
    assert modes == [b.mode(t, s) for t in tasks for s in range(2)]
    c = collections.Counter(modes)
    assert 0.15 < c["wrong_answer"] / 600 < 0.25 and 0.06 < c["malformed_call"] / 600 < 0.14
    assert c["exit_hack"] == 0  # numeric tasks ignore the code-task hack
    assert modes != [ReferencePolicy(noise=noise, seed=6).mode(t, s) for t in tasks for s in range(2)]
    with pytest.raises(ValueError, match="add up"):
        ReferenceNoise(wrong_answer=0.7, no_tool=0.5)


def test_mixture_assignment_is_deterministic_and_weighted():
    tasks = arithmetic.generate(400, split="train", seed=2)
    p1, p2 = ReferencePolicy(name="big"), ReferencePolicy(name="small")
    m = Mixture([p1, p2], [3, 1], seed=0)
    names = [m.assign(t, s).name for t in tasks for s in range(2)]
    assert names == [Mixture([p1, p2], [3, 1]).assign(t, s).name for t in tasks for s in range(2)]
    share = names.count("big") / len(names)
    assert 0.70 < share < 0.80, share
    jobs = plan(tasks, m, samples=2, run_id="r", round=0)
    assert len(jobs) == 800 and collections.Counter(j[2].name for j in jobs)["big"] == names.count("big")
    with pytest.raises(ValueError, match="unique"):
        Mixture([p1, ReferencePolicy(name="big")])
    with pytest.raises(ValueError, match="> 0"):
        Mixture([p1, p2], [1, 0])


def test_mixture_yield_per_teacher(direct_tasks, no_sandbox):
    good = ReferencePolicy(name="good", noise=ReferenceNoise(no_tool=1.0))
    bad = ReferencePolicy(name="bad", noise=ReferenceNoise(no_tool=1.0), seed=1)
    bad.reply = _wrong_reply  # type: ignore[method-assign]
    s = asyncio.run(rollout(direct_tasks, Mixture([good, bad], [1, 1]), no_sandbox, run_id="m", samples=10,
                            concurrency=4, progress=False))
    assert s.episodes == 40 and set(s.by_policy) == {"good", "bad"}
    assert s.by_policy["good"].yield_rate == 1.0 and s.by_policy["bad"].yield_rate == 0.0
    assert s.by_policy["good"].episodes + s.by_policy["bad"].episodes == 40


async def _wrong_reply(messages, tools, *, task, sample_index):
    return PolicyReply(message=Message(role="assistant", content="Answer: -1"))


def test_configs_build_policies(tmp_path):
    assert build_policy(PolicyConfig()).name == "reference"
    cfg = PolicyConfig(kind="openai", base_url="http://127.0.0.1:1/v1", model="m", temperature=0.1,
                       price={"prompt_per_1m": 1.0, "completion_per_1m": 2.0}, concurrency=3)
    pol = build_policy(cfg)
    assert (pol.name, pol.endpoint, pol.concurrency, pol.prompt_price_per_1m) == ("m", "http://127.0.0.1:1/v1", 3, 1.0)
    with pytest.raises(ValueError, match="needs base_url"):
        PolicyConfig(kind="openai")
    with pytest.raises(ValueError):
        PolicyConfig(kind="reference", bogus=1)
    with pytest.raises(EndpointError, match="cannot reach"):
        check_policy(cfg, timeout=1.0)
    with pytest.raises(PolicySetupError, match="does not exist"):
        check_policy(PolicyConfig(kind="transformers", model=str(tmp_path / "missing")))
    m = mixture_from_config(MixtureConfig(policies=[PolicyConfig(name="a", weight=2), PolicyConfig(name="b")]))
    assert m.shares() == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    with pytest.raises(ValueError, match="unique"):
        mixture_from_config(MixtureConfig(policies=[PolicyConfig(), PolicyConfig()]))


def test_vllm_missing_gives_the_install_fix():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here; the missing-extra path cannot be shown")
    with pytest.raises(PolicySetupError, match=r"pip install 'flywheel\[gpu\]'"):
        build_policy(PolicyConfig(kind="vllm", model="Qwen/Qwen2.5-0.5B-Instruct"))
    with pytest.raises(PolicySetupError, match=r"flywheel\[gpu\]"):
        check_policy(PolicyConfig(kind="vllm", model="x"))


def test_micro_batcher_gathers_concurrent_calls_and_propagates_errors():
    from agents.vllm_policy import MicroBatcher

    def square(xs):
        if -1 in xs:
            raise ValueError("bad item")
        return [x * x for x in xs]

    async def main():
        b = MicroBatcher(square, max_batch=8, window_s=0.01)
        out = await asyncio.gather(*(b.submit(i) for i in range(20)))
        with pytest.raises(ValueError, match="bad item"):
            await asyncio.gather(b.submit(-1), b.submit(2))
        return b, out

    b, out = asyncio.run(main())
    assert out == [i * i for i in range(20)]
    assert sum(b.batches[:-1]) == 20 and max(b.batches) <= 8 and len(b.batches) <= 4


def test_gpu_smoke_script_runs_its_cpu_parts_and_says_what_is_missing():
    import subprocess
    from pathlib import Path

    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["bash", str(root / "scripts" / "gpu_smoke.sh")], capture_output=True, text=True, timeout=120, check=False,
                         env={**__import__("os").environ, "PYTHON": __import__("sys").executable})
    assert out.returncode == 2 and "pip install 'flywheel[gpu]'" in out.stderr, out.stderr
    # the CPU parts ran (the three students built); every GPU step is a row that says skip, and why
    assert "built tiny-gptoss, tiny-qwen3, tiny in" in out.stdout, out.stdout
    skips = [line for line in out.stdout.splitlines() if line.startswith("skip: ")]
    assert [s.split(" (")[0] for s in skips] == ["skip: vLLM offline + panel"] * 2 + [
        "skip: vllm serve + OpenAI", "skip: GRPO, vLLM colocate"], out.stdout
    assert all("flywheel[gpu]" in s for s in skips)
    assert sum(" | skip | " in line for line in out.stdout.splitlines()) == 4


def test_a_task_with_an_unknown_tool_is_a_row_not_a_crash(direct_tasks, no_sandbox):
    bad = direct_tasks[0].model_copy(update={"tools": ["teleport"]})
    row = episode(bad, ReferencePolicy(), no_sandbox)
    assert row.verdict == "infra_error" and row.error_class == "ValueError" and "teleport" in row.error_message
