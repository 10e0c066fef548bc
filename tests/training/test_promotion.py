"""The promotion rule of a round with GRPO (training.evaluate.choose_promotion): GRPO's checkpoint goes on unless
its held-out sampled pass@1 is below SFT's by more than the margin; the fixed rules always pick theirs."""

from __future__ import annotations

import pytest

from training.evaluate import choose_promotion


def _choose(rule, sft, grpo, margin=0.05):
    return choose_promotion(rule, margin, sft_greedy=0.5, grpo_greedy=0.4, sft_sampled=sft, grpo_sampled=grpo,
                            sft_n=200, grpo_n=200)


def test_grpo_unless_worse_by_more_than_the_margin():
    better = _choose("grpo_unless_worse", 0.40, 0.48)
    assert (better.choice, better.code) == ("grpo", "grpo_not_worse")
    assert better.gain_sampled == pytest.approx(0.08) and better.gain_greedy == pytest.approx(-0.1)
    # the standard error of a difference of two proportions over 200 episodes each
    assert better.gain_sampled_se == pytest.approx((0.4 * 0.6 / 200 + 0.48 * 0.52 / 200) ** 0.5)
    within = _choose("grpo_unless_worse", 0.40, 0.36)
    assert (within.choice, within.code) == ("grpo", "grpo_not_worse")
    worse = _choose("grpo_unless_worse", 0.40, 0.34)
    assert (worse.choice, worse.code) == ("sft", "grpo_worse_than_margin")
    assert "0.340" in worse.reason and "0.400" in worse.reason and "margin 0.05" in worse.reason
    assert _choose("grpo_unless_worse", 0.40, 0.34, margin=0.1).choice == "grpo"


def test_fixed_rules():
    assert _choose("grpo", 0.9, 0.1).code == "rule_grpo"
    assert _choose("sft", 0.1, 0.9).code == "rule_sft"
