"""The mismatch panel: its figures on known numbers; on real tiny-gptoss rollouts (real sandbox, in-process policy)
the fp32 trainer agrees with the rollout's stored logprobs, a bf16 trainer does not, and the thresholds say so."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from training.config import MismatchThresholds
from training.mismatch import MismatchError, clip_fraction, panel, promotion_refusals, rows_panel


def test_figures_on_known_numbers():
    same = panel([[-1.0, -2.0, -0.5]], [[-1.0, -2.0, -0.5]], old=[[-1.0, -2.0, -0.5]])
    assert same.mean_abs_diff == 0 and same.max_abs_diff == 0 and same.token_mult_prob_error == 1.0
    assert same.pearson == pytest.approx(1.0) and same.iw_min == same.iw_max == 1.0 and same.clip_fraction == 0
    assert promotion_refusals(same, MismatchThresholds()) == []
    shifted = panel([[-0.9, -1.9], [-0.4]], [[-1.0, -2.0], [-0.5]], old=[[-1.2, -1.9], [-0.4]])
    assert shifted.tokens == 3 and shifted.sequences == 2
    assert shifted.mean_abs_diff == pytest.approx(0.1) and shifted.token_mult_prob_error == pytest.approx(math.exp(0.1))
    assert shifted.iw_mean == pytest.approx(math.exp(0.1))
    assert shifted.clip_fraction == pytest.approx(1 / 3)  # exp(0.3) = 1.35 > 1.2 for one token of three
    lines = promotion_refusals(shifted, MismatchThresholds(max_mean_abs_logp_diff=0.05))
    assert any("mean |Δlogp|" in line and "max_mean_abs_logp_diff" in line for line in lines)
    assert any("clip fraction" in line for line in lines)
    assert clip_fraction(torch.zeros(4), torch.tensor([0.0, 0.0, 0.5, -0.5])) == 0.5
    with pytest.raises(MismatchError, match="same sequences"):
        panel([[-1.0]], [[-1.0, -2.0]])


@pytest.fixture(scope="module")
def gptoss_rows(tmp_path_factory, train_tasks, backend):
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy
    from training.tiny import build_tiny_model, task_corpus

    path = build_tiny_model(tmp_path_factory.mktemp("mm") / "gptoss", task_corpus(train_tasks, family="tiny-gptoss"),
                            family="tiny-gptoss", hidden=32, layers=2, heads=2, kv_heads=1, vocab_size=600)
    policy = TransformersPolicy(path, temperature=1.0, max_new_tokens=16, seed=3, batch_size=4)
    rows: list = []
    asyncio.run(rollout(train_tasks[:4], policy, backend, run_id="mm", concurrency=4, on_rows=rows.extend,
                        batch_size=4, progress=False))
    return path, policy, rows


def test_trainer_agrees_in_fp32_and_the_panel_sees_bf16(gptoss_rows):
    from transformers import AutoModelForCausalLM

    path, policy, rows = gptoss_rows
    assert len(rows) == 4 and all(r.completion_logprobs for r in rows)
    fp32 = rows_panel(AutoModelForCausalLM.from_pretrained(path).eval(), policy.tokenizer, rows)
    assert fp32.tokens >= 4 and fp32.token_mult_prob_error < 1.001 and fp32.mean_abs_diff < 1e-3, fp32
    bf16 = rows_panel(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval(), policy.tokenizer, rows)
    assert bf16.mean_abs_diff > 10 * fp32.mean_abs_diff and bf16.token_mult_prob_error > fp32.token_mult_prob_error
    strict = MismatchThresholds(max_mean_abs_logp_diff=fp32.mean_abs_diff * 2)
    assert promotion_refusals(fp32, strict) == [] and promotion_refusals(bf16, strict)


def test_rows_without_logprobs_are_refused(gptoss_rows):
    _, policy, rows = gptoss_rows
    bare = [r.model_copy(update={"completion_logprobs": None}) for r in rows]
    with pytest.raises(MismatchError, match="completion_logprobs"):
        rows_panel(None, policy.tokenizer, bare)


def test_a_trainer_without_sinks_is_flagged_and_the_sink_aware_kernel_closes_it(gptoss_rows):
    """The GPT-OSS retrospective's bug on purpose: rollouts with sinks (eager), the trainer's attention without them
    (training.attention's sdpa_nosinks stand-in); a limit the matched trainer passes by three orders of magnitude
    refuses it; the fix (a sink-aware kernel in the trainer, sdpa_sinks) agrees with the rollouts as closely as the
    matched trainer. (An untrained model's near-uniform next-token distributions keep the gap small in nats; the
    benchmark measures it on a trained student.)"""
    from transformers import AutoModelForCausalLM

    from training.attention import use_attention

    path, policy, rows = gptoss_rows
    trainer = {name: rows_panel(use_attention(AutoModelForCausalLM.from_pretrained(path).eval(), name),
                                policy.tokenizer, rows) for name in ("eager", "sdpa_nosinks", "sdpa_sinks")}
    print({k: (p.mean_abs_diff, p.token_mult_prob_error, p.iw_max) for k, p in trainer.items()})
    limit = MismatchThresholds(max_mean_abs_logp_diff=1e-4)
    assert trainer["eager"].mean_abs_diff < 1e-6 and promotion_refusals(trainer["eager"], limit) == []
    assert trainer["sdpa_nosinks"].mean_abs_diff > 1e3 * trainer["eager"].mean_abs_diff
    assert trainer["sdpa_nosinks"].iw_max > trainer["eager"].iw_max
    assert any("max_mean_abs_logp_diff" in line for line in promotion_refusals(trainer["sdpa_nosinks"], limit))
    assert trainer["sdpa_sinks"].mean_abs_diff < 1e-6 and promotion_refusals(trainer["sdpa_sinks"], limit) == []
