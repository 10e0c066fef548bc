"""Diagnostics: metrics collected from trainer logs; warnings when thresholds are crossed."""

from __future__ import annotations

from types import SimpleNamespace

from training.config import DiagnosticsThresholds
from training.diagnostics import DiagnosticsCallback, StepDiagnostics, check_step


def test_healthy_step_has_no_warning():
    d = StepDiagnostics(step=1, loss=0.5, grad_norm=1.0, reward=0.4, reward_std=0.3, zero_advantage_share=0.2,
                        entropy=0.8, kl=0.01, logprob_diff_mean=0.01, importance_weight_max=1.1)
    assert check_step(d, DiagnosticsThresholds()) == []


def test_each_threshold_warns():
    t = DiagnosticsThresholds()
    cases = {
        "zero advantage": StepDiagnostics(step=2, zero_advantage_share=1.0),
        "collapsing": StepDiagnostics(step=2, entropy=0.001),
        "KL": StepDiagnostics(step=2, kl=5.0),
        "grad norm": StepDiagnostics(step=2, grad_norm=1e4),
        "logprob difference": StepDiagnostics(step=2, logprob_diff_mean=2.0),
        "importance weight": StepDiagnostics(step=2, importance_weight_max=50.0),
        "not finite": StepDiagnostics(step=2, loss=float("nan")),
    }
    for needle, d in cases.items():
        w = check_step(d, t)
        assert len(w) == 1 and needle in w[0], (needle, w)


def test_entropy_warns_on_a_fall_not_on_a_student_that_starts_sharp():
    cb = DiagnosticsCallback()
    for step, entropy in enumerate([0.03, 0.025, 0.02, 0.012], start=1):  # sharp after SFT, then halves
        cb.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": 0.0, "entropy": entropy})
    assert len(cb.warnings) == 1 and "step 4" in cb.warnings[0] and "collapsing" in cb.warnings[0]
    cb = DiagnosticsCallback()
    for step, entropy in enumerate([0.9, 0.5, 0.04], start=1):  # a real collapse from a broad start
        cb.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": 0.0, "entropy": entropy})
    assert [w.split(":")[0] for w in cb.warnings] == ["step 3"]


def test_callback_reads_trl_keys():
    cb = DiagnosticsCallback()
    state = SimpleNamespace(global_step=3)
    cb.on_log(None, state, None, logs={"loss": 0.2, "reward": 0.5, "reward_std": 0.1, "frac_reward_zero_std": 0.95,
                                       "entropy": 0.7, "kl": 0.0, "grad_norm": 0.9,
                                       "sampling/sampling_logp_difference/mean": 0.01,
                                       "sampling/importance_sampling_ratio/max": 1.2})
    cb.on_log(None, state, None, logs={"train_runtime": 1.0})  # end-of-training summary: ignored
    assert len(cb.steps) == 1
    d = cb.steps[0]
    assert d.zero_advantage_share == 0.95 and d.logprob_diff_mean == 0.01 and d.importance_weight_max == 1.2
    assert len(cb.warnings) == 1 and "zero advantage" in cb.warnings[0]
    s = cb.summary()
    assert s["reward_mean"] == 0.5 and s["warnings"] == cb.warnings


def test_exploding_gradient_norms_stop_the_run():
    """With stop=True (GRPO) a grad norm above stop_grad_norm, or not finite, stops training once and says why;
    below it, or with stop=False (SFT), it only warns."""
    t = DiagnosticsThresholds(stop_grad_norm=1000.0)
    for norm, stops in ((999.0, False), (1500.0, True), (float("nan"), True), (float("inf"), True)):
        cb, control = DiagnosticsCallback(t, stop=True), SimpleNamespace(should_training_stop=False)
        cb.on_log(None, SimpleNamespace(global_step=4), control, logs={"loss": 0.1, "grad_norm": norm})
        assert control.should_training_stop is stops and (cb.stopped is not None) is stops, norm
        if stops:
            assert cb.stopped.startswith("step 4: grad norm") and "stop_grad_norm 1000" in cb.stopped
    quiet, control = DiagnosticsCallback(t), SimpleNamespace(should_training_stop=False)
    quiet.on_log(None, SimpleNamespace(global_step=1), control, logs={"loss": 0.1, "grad_norm": 1500.0})
    assert not control.should_training_stop and quiet.stopped is None and "grad norm 1500.0" in quiet.warnings[0]
