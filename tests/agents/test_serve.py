"""A tiny student trained here, served by `transformers serve` on 127.0.0.1, driven by the OpenAI-compatible policy
through the real episode loop: its tool calls round-trip into rows, and the in-process TransformersPolicy reaches
the same verdicts on the same tasks (greedy decoding)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks import arithmetic

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# The student memorises these few episodes (cheap), so that it writes real tool calls on them: what is tested is
# the serving path and the OpenAI client, not how well a tiny model generalises (benchmarks/train_arithmetic.py).
SERVE_TASKS = arithmetic.generate(6, split="train", seed=21)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend():
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig, SandboxUnavailable

    for kind in ("local", "docker"):
        try:
            return open_backend(SandboxConfig(backend=kind, timeout_s=5.0), pool_size=1)
        except SandboxUnavailable:
            continue
    pytest.skip("no sandbox backend (bubblewrap or Docker) on this machine")


def _rollout(tasks, policy, backend, run_id, concurrency=4):
    from agents.rollout import rollout

    rows = []
    asyncio.run(rollout(tasks, policy, backend, run_id=run_id, concurrency=concurrency, on_rows=rows.extend,
                        batch_size=len(tasks), progress=False, max_turns=3))
    return sorted(rows, key=lambda r: r.task_id)


@pytest.fixture(scope="module")
def backend():
    with _backend() as b:
        yield b


@pytest.fixture(scope="module")
def student(tmp_path_factory, backend):
    """A tiny model that memorised a few reference-teacher episodes, so it writes well-formed tool calls on them.

    (Well-formed matters: `transformers serve` answers a malformed tool call with HTTP 500, which the OpenAI
    policy must treat as an endpoint failure, while the in-process policy reports a model_error.)"""
    import torch

    from agents.reference import ReferencePolicy
    from training.config import SFTConfig
    from training.sft import train_sft
    from training.tiny import build_tiny_model, task_corpus

    torch.set_num_threads(1)
    tasks = SERVE_TASKS
    rows = _rollout(tasks, ReferencePolicy(), backend, "serve-ref", concurrency=4)
    assert all(r.verdict == "pass" for r in rows)
    d = tmp_path_factory.mktemp("serve")
    base = build_tiny_model(d / "base", task_corpus(tasks), hidden=64, layers=2, heads=4, kv_heads=2)
    res = train_sft(base, rows, d / "student", SFTConfig(max_steps=300, batch_size=8, learning_rate=5e-3,
                                                         warmup_ratio=0.0), progress=False)
    return Path(res.checkpoint_path)


@contextlib.contextmanager
def transformers_serve(model_dir: Path):
    """`transformers serve MODEL_DIR` on a free 127.0.0.1 port (CPU, one thread, offline); yields its /v1 URL and
    stops it. Its log is MODEL_DIR/serve.log."""
    port = _free_port()
    exe = str(Path(sys.executable).with_name("transformers"))
    log = open(model_dir / "serve.log", "w")  # noqa: SIM115
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([exe, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device",
                             "cpu", "--default-seed", "0"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"transformers serve did not start: {(model_dir / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server(student):
    with transformers_serve(student) as url:
        yield url


def test_served_student_tool_calls_round_trip_and_match_in_process_verdicts(student, server, backend):
    from agents.openai_policy import OpenAIPolicy
    from agents.transformers_policy import TransformersPolicy

    tasks = SERVE_TASKS
    served = OpenAIPolicy(base_url=server, model=str(student), name="served", source="student", temperature=0.0,
                          max_tokens=64, seed=0, max_retries=0, timeout_s=120)
    local = TransformersPolicy(student, name="local", temperature=0.0, max_new_tokens=64, device="cpu")
    served_rows = _rollout(tasks, served, backend, "serve-http")
    local_rows = _rollout(tasks, local, backend, "serve-local")
    pairs = list(zip(served_rows, local_rows, strict=True))
    assert [s.task_id for s, _ in pairs] == [loc.task_id for _, loc in pairs]
    for s, loc in pairs:
        if s.verdict == "infra_error":
            # `transformers serve` answers a malformed tool call with HTTP 500 (EndpointError after retries);
            # in process, the same greedy output is a model_error. Anything else is a real disagreement.
            assert loc.verdict == "model_error" and "500" in (s.error_message or ""), (s.error_message, loc.verdict)
        else:
            # the same student, in process and behind HTTP, reaches the same verdict and answer
            assert (s.verdict, s.answer) == (loc.verdict, loc.answer), (s.messages, loc.messages)
    ok = [s for s, _ in pairs if s.verdict != "infra_error"]
    assert len(ok) >= len(tasks) // 2, [s.error_message for s, _ in pairs]
    # tool calls came back over HTTP as structured calls, ran in the sandbox, and landed in the rows
    called = [r for r in ok if r.n_tool_calls]
    assert called, [(s.verdict, [m.content for m in s.messages[2:]]) for s in ok]
    assert all(any(m.role == "tool" and m.tool_call_id for m in r.messages) for r in called)
    assert all(r.endpoint == server for r in served_rows)
