"""The episode loop with real tool calls in real Docker sandboxes (marker docker).

The reference teacher on the arithmetic suite (clean and noisy), the OpenAI policy against the fault-injecting
server with tool calls that round-trip through containers, max_turns, and resume after kill -9 into a real lake.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agents.openai_policy import OpenAIPolicy
from agents.reference import ReferenceNoise, ReferencePolicy
from agents.rollout import rollout
from tasks import arithmetic
from warehouse.record import trajectory_id

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def go(tasks, pol, backend, **kw):
    rows = []
    summary = asyncio.run(rollout(tasks, pol, backend, run_id=kw.pop("run_id", "dock"), on_rows=rows.extend,
                                  progress=False, retry_backoff_s=0.05, **kw))
    assert len(rows) == len({r.trajectory_id for r in rows}) == summary.episodes
    return summary, rows


def test_reference_teacher_in_docker(docker_backend):
    tasks = arithmetic.generate(4, split="train", seed=3)
    summary, rows = go(tasks, ReferencePolicy(), docker_backend, samples=2, concurrency=4, run_id="ref")
    assert summary.verdicts == {"pass": 8}
    for r in rows:
        assert [m.role for m in r.messages] == ["system", "user", "assistant", "tool", "assistant"]
        call = r.messages[2].tool_calls[0]
        assert r.messages[3].tool_call_id == call.id and r.messages[3].name == "python"
        task = next(t for t in tasks if t.id == r.task_id)
        assert r.messages[3].content == task.verifier.answer  # the observation really came from the sandbox
        assert r.trajectory_id == trajectory_id("ref", 0, r.task_id, "reference", r.sample_index)
        assert r.sandbox_backend == "docker" and r.sandbox_image and r.sandbox_image.startswith("sha256:")
        assert r.verifier == "numeric" and r.verifier_version and r.success and r.reward == 1.0
        assert (r.turns, r.n_tool_calls) == (2, 1) and r.latency_ms > 0
    # deterministic ids: a second run plans the same ids, and skipping them runs nothing
    s2, rows2 = go(tasks, ReferencePolicy(), docker_backend, samples=2, run_id="ref",
                   skip_ids={r.trajectory_id for r in rows})
    assert s2.skipped == 8 and rows2 == []


def test_noisy_reference_verdicts_follow_modes(docker_backend):
    tasks = arithmetic.generate(12, split="train", seed=4)
    pol = ReferencePolicy(noise=ReferenceNoise(wrong_answer=0.3, malformed_call=0.2, no_tool=0.2), seed=1)
    _, rows = go(tasks, pol, docker_backend, samples=1, concurrency=4)
    expected = {"clean": {"pass"}, "wrong_answer": {"fail"}, "malformed_call": {"model_error"},
                "no_tool": {"hack"}}  # the verifier's forensics flag no_tool_use
    modes = set()
    for r in rows:
        task = next(t for t in tasks if t.id == r.task_id)
        mode = pol.mode(task, r.sample_index)
        modes.add(mode)
        assert r.verdict in expected[mode], (mode, r.verdict, r.error_message)
        if mode == "no_tool":
            assert r.n_tool_calls == 0
        if mode == "malformed_call":
            assert r.error_class == "ToolArgumentError"
    assert len(modes) >= 3, modes


@pytest.mark.parametrize("model", ["ok", "text", "logprobs", "ratelimit:1:1", "e503:2", "drop:1", "slow:1:3"])
def test_openai_policy_tool_calls_round_trip_through_sandboxes(server, tasks4, docker_backend, model):
    pol = OpenAIPolicy(base_url=server.base_url, model=model, name=model.split(":")[0], max_retries=3,
                       backoff_base_s=0.05, timeout_s=1.0)
    _, rows = go(tasks4, pol, docker_backend, concurrency=4)
    assert {r.verdict for r in rows} == {"pass"}, [(r.verdict, r.error_message) for r in rows]
    for r in rows:
        assert r.n_tool_calls == 1 and r.turns == 2 and r.endpoint == server.base_url
        assert r.messages[3].role == "tool" and r.messages[3].tool_call_id == r.messages[2].tool_calls[0].id
    assert server.count(model, "ok") == 8  # two turns per episode, each answered once
    if model == "logprobs":
        r = rows[0]
        assert len(r.completion_token_ids) == 2 == len(r.completion_logprobs)
        assert all(len(a) == len(b) > 0 for a, b in zip(r.completion_token_ids, r.completion_logprobs))


def test_max_turns_is_a_timeout_row(server, tasks4, docker_backend):
    pol = OpenAIPolicy(base_url=server.base_url, model="ok", max_retries=0)
    _, rows = go(tasks4[:2], pol, docker_backend, max_turns=1)
    assert {(r.verdict, r.error_class) for r in rows} == {("timeout", "MaxTurns")}
    assert all(r.reward == 0 and r.turns == 1 and r.n_tool_calls == 1 for r in rows)


N_RESUME = 120  # 60 tasks x 2 samples: with container reuse (~50 episodes/s) 20 could all land before the kill
RESUME_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from agents.reference import ReferencePolicy
    from agents.rollout import rollout
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks import arithmetic
    from warehouse.lake import existing_ids, write_trajectories

    root = sys.argv[1]
    tasks = arithmetic.generate(60, split="train", seed=9)
    with open_backend(SandboxConfig()) as backend:
        s = asyncio.run(rollout(tasks, ReferencePolicy(), backend, run_id="resume", samples=2, concurrency=2,
                                skip_ids=existing_ids(root, "resume", 0), batch_size=2, progress=False,
                                on_rows=lambda rows: write_trajectories(root, rows)))
        print("DONE", s.episodes, s.skipped, flush=True)
""")


def test_resume_after_kill_9_adds_no_duplicates(tmp_path, docker_backend):
    from warehouse.lake import existing_ids
    from warehouse.query import query

    root = str(tmp_path / "lake")
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), root], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(existing_ids(root, "resume", 0)) < 4 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = existing_ids(root, "resume", 0)
    assert 4 <= len(before) < N_RESUME, f"kill came too late or too early: {len(before)} rows"
    out = subprocess.run([sys.executable, str(script), root], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    done = next(ln for ln in out.stdout.splitlines() if ln.startswith("DONE")).split()
    assert int(done[1]) == N_RESUME - len(before) and int(done[2]) == len(before)
    # count the rows in the files themselves (the trajectories view deduplicates by id)
    files = sorted(Path(root).rglob("part-*.parquet"))
    ids = [i for f in files for i in pq.read_table(f, columns=["trajectory_id"]).column(0).to_pylist()]
    assert len(ids) == N_RESUME == len(set(ids)), f"{len(ids)} rows for {len(set(ids))} ids"
    t = query(root, "SELECT count(*) AS n, sum(CASE WHEN verdict = 'pass' THEN 1 ELSE 0 END) AS p "
                    "FROM trajectories").to_pylist()[0]
    assert t == {"n": N_RESUME, "p": N_RESUME}


@pytest.mark.parametrize("suite", ["code", "mathword"])
def test_reference_teacher_on_other_suites(docker_backend, suite):
    from tasks.suites import load_suite

    tasks = load_suite(suite, n=3, split="train", seed=2)
    summary, rows = go(tasks, ReferencePolicy(), docker_backend, samples=1, concurrency=3, run_id=f"ref-{suite}")
    assert summary.verdicts == {"pass": 3}, [(r.verdict, r.error_class, r.error_message, r.verifier_details_json[:300])
                                            for r in rows]


def test_reference_hacks_are_caught(docker_backend):
    from tasks.suites import load_suite

    code = load_suite("code", n=3, split="train", seed=5)
    pol = ReferencePolicy(noise=ReferenceNoise(exit_hack=1.0))
    _, rows = go(code, pol, docker_backend, run_id="hack-code", concurrency=3)
    assert {r.verdict for r in rows} == {"hack"}, [(r.verdict, r.error_message) for r in rows]
    assert all(r.hack_flags and not r.success for r in rows)
    arith = arithmetic.generate(3, split="train", seed=5)
    _, rows = go(arith, ReferencePolicy(noise=ReferenceNoise(no_tool=1.0)), docker_backend, run_id="hack-arith")
    assert {r.verdict for r in rows} == {"hack"} and all("no_tool_use" in r.hack_flags for r in rows)
