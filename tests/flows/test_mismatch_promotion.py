"""Promotion through the mismatch panel, in a real Prefect flow: a round whose student rollouts were sampled in
bf16 (the trainer recomputes in fp32) crosses a tight [mismatch] threshold, so the next round starts from the
previous checkpoint and the stage's record names the figure (the run's log line is built from it); the same rows under the default thresholds are promoted."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lake_with_bf16_rollouts(tmp_path_factory):
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks import arithmetic
    from training.tiny import build_tiny_model, task_corpus
    from warehouse.lake import write_trajectories

    root = tmp_path_factory.mktemp("mm-lake")
    tasks = arithmetic.generate(4, split="train", seed=5)
    model = build_tiny_model(root / "student", task_corpus(tasks, family="tiny-gptoss"), family="tiny-gptoss",
                             hidden=32, layers=2, heads=2, kv_heads=1, vocab_size=500)
    policy = TransformersPolicy(model, temperature=1.0, max_new_tokens=24, seed=2, dtype="bfloat16",
                                name="student-r1")
    rows: list = []
    with open_backend(SandboxConfig(backend="local", timeout_s=5.0), pool_size=2) as backend:
        asyncio.run(rollout(tasks, policy, backend, run_id="mm", round=1, concurrency=4, on_rows=rows.extend,
                            batch_size=4, progress=False))
    assert rows and all(r.source == "student" and r.completion_logprobs for r in rows)
    write_trajectories(str(root), rows)
    return root, model


def _promote_in_a_flow(root, model, thresholds: dict) -> tuple[dict, dict]:
    from prefect import flow

    from flows.config import FlywheelConfig
    from flows.flywheel import _promote
    from flows.stages import Ledger

    cfg = FlywheelConfig.model_validate({"run": {"out": str(root), "run_id": "mm"}, "mismatch": thresholds})
    previous = {"checkpoint_id": "base-r0", "path": "previous"}
    student = {"checkpoint_id": "grpo-r1", "path": str(model)}

    ledger = Ledger(str(root), f"mm-{len(thresholds)}")

    @flow(name="promote-test")
    def run() -> dict:
        return _promote(ledger, cfg, "mm", 1, student, previous)

    return run(), ledger.get(1, "mismatch")


def test_a_crossed_threshold_keeps_the_previous_student(prefect_api, lake_with_bf16_rollouts):
    root, model = lake_with_bf16_rollouts
    chosen, stage = _promote_in_a_flow(root, model, {"max_mean_abs_logp_diff": 1e-4})
    assert chosen["checkpoint_id"] == "base-r0"
    assert len(stage["refused"]) == 1 and "(mismatch.max_mean_abs_logp_diff)" in stage["refused"][0]
    assert stage["panel"]["clip_fraction"] == 0.0  # the trainer agrees with itself (fp32, other batches)
    from warehouse.query import query

    figures = {r["metric"]: r["value"] for r in query(str(root), "SELECT metric, value FROM rounds WHERE "
                                                                 "subject = 'mismatch'").to_pylist()}
    assert figures["mm:mean_abs_diff"] > 1e-4 and figures["mm:token_mult_prob_error"] > 1.0
    # the limits that applied, beside the figures (the report draws them); min_pearson -1 never refuses: none
    assert figures["mm_max:mean_abs_diff"] == 1e-4 and figures["mm_max:token_mult_prob_error"] == 1.1
    assert "mm_min:pearson" not in figures


def test_default_thresholds_promote(prefect_api, lake_with_bf16_rollouts):
    root, model = lake_with_bf16_rollouts
    chosen, stage = _promote_in_a_flow(root, model, {})
    assert chosen["checkpoint_id"] == "grpo-r1" and stage["refused"] == []
