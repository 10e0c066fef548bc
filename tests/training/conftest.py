"""Fixtures of the training tests: arithmetic tasks, reference-teacher trajectories produced through the real
episode loop in real sandboxes (local bubblewrap backend, else Docker), and tiny models built from scratch."""

from __future__ import annotations

import asyncio

import pytest
import torch

torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared 2-core machine (OpenMP spin-waits)

from sandbox.result import SandboxConfig
from tasks import arithmetic


def open_test_backend():
    """The local bubblewrap backend when it works here, else the Docker backend; skip when neither can run."""
    from sandbox.backend import open_backend
    from sandbox.result import SandboxUnavailable

    errors = []
    for kind in ("local", "docker"):
        try:
            return open_backend(SandboxConfig(backend=kind, timeout_s=5.0), pool_size=1)
        except SandboxUnavailable as e:
            errors.append(f"{kind}: {e}")
    pytest.skip("no sandbox backend: " + "; ".join(errors))


@pytest.fixture(scope="session")
def backend():
    with open_test_backend() as b:
        yield b


def reference_rows(tasks, backend, run_id="test-ref"):
    """Reference-teacher episodes through agents.rollout (real loop, real sandboxes)."""
    from agents.reference import ReferencePolicy
    from agents.rollout import rollout

    rows = []
    asyncio.run(rollout(tasks, ReferencePolicy(), backend, run_id=run_id, concurrency=4, on_rows=rows.extend,
                        batch_size=len(tasks), progress=False))
    order = {t.id: i for i, t in enumerate(tasks)}
    return sorted(rows, key=lambda r: order[r.task_id])  # episodes finish in thread-timing order; SFT data must not


@pytest.fixture(scope="session")
def train_tasks():
    return arithmetic.generate(48, split="train", seed=3, difficulty=1)


@pytest.fixture(scope="session")
def ref_rows(train_tasks, backend):
    rows = reference_rows(train_tasks, backend)
    assert len(rows) == len(train_tasks) and all(r.verdict == "pass" for r in rows), [r.verdict for r in rows]
    return rows


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, train_tasks):
    from training.tiny import build_tiny_model, task_corpus

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", task_corpus(train_tasks), hidden=32, layers=2,
                            heads=2, kv_heads=1, vocab_size=600, seed=0)
