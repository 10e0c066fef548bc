"""The promotion rule of a round with GRPO (training.promotion.choose_promotion): GRPO's checkpoint goes on unless
its held-out sampled pass@1 is below SFT's by more than the margin, or its greedy pass@1 is below SFT's by more
than the greedy margin; the fixed rules always pick theirs."""

from __future__ import annotations

import pytest

from training.promotion import choose_promotion


def _choose(rule, sft, grpo, margin=0.05, sft_greedy=0.5, grpo_greedy=0.6, greedy_margin=0.0):
    return choose_promotion(rule, margin, sft_greedy=sft_greedy, grpo_greedy=grpo_greedy, sft_sampled=sft,
                            grpo_sampled=grpo, sft_n=200, grpo_n=200, greedy_margin=greedy_margin)


def test_grpo_unless_worse_by_more_than_the_margin():
    better = _choose("grpo_unless_worse", 0.40, 0.48)
    assert (better.choice, better.code) == ("grpo", "grpo_not_worse")
    assert better.gain_sampled == pytest.approx(0.08) and better.gain_greedy == pytest.approx(0.1)
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


def test_a_greedy_drop_beyond_the_greedy_margin_keeps_sft():
    # better sampled, but greedy fell 0.89 -> 0.86 (the round-2 case of a make run): refused at the default 0
    lower = _choose("grpo_unless_worse", 0.868, 0.873, sft_greedy=0.89, grpo_greedy=0.86)
    assert (lower.choice, lower.code) == ("sft", "grpo_greedy_lower")
    assert "0.860" in lower.reason and "0.890" in lower.reason and "greedy margin 0" in lower.reason
    assert lower.gain_greedy == pytest.approx(-0.03)
    # equal greedy is not a drop; a drop within a wider greedy margin passes
    assert _choose("grpo_unless_worse", 0.868, 0.873, sft_greedy=0.89, grpo_greedy=0.89).code == "grpo_not_worse"
    assert _choose("grpo_unless_worse", 0.868, 0.873, sft_greedy=0.89, grpo_greedy=0.86,
                   greedy_margin=0.05).code == "grpo_not_worse"
    # the fixed rules ignore it
    assert _choose("grpo", 0.868, 0.873, sft_greedy=0.89, grpo_greedy=0.5).choice == "grpo"
