"""Training diagnostics: per-step health metrics collected from TRL's logs, with warnings when thresholds are crossed.

`DiagnosticsCallback` is a transformers TrainerCallback. At each log event it keeps one `StepDiagnostics` row:
loss, grad norm, learning rate, and for GRPO the mean reward, reward std within groups, the share of groups whose
rewards are all equal (zero advantage: no learning signal), token entropy, KL to the reference, tool-call and
tool-failure frequencies, and, when rollout logprobs exist (vLLM generation), the rollout-vs-trainer logprob
difference and importance-sampling weights (the GPT-OSS retrospective's silent collapse). A crossed threshold
(training.config.DiagnosticsThresholds) logs a warning and is recorded in `warnings` for the report.
This module does not change training.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from pydantic import BaseModel, Field
from transformers import TrainerCallback

from training.config import DiagnosticsThresholds

log = logging.getLogger(__name__)

# TRL log key -> our field
_KEYS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "zero_advantage_share",
    "entropy": "entropy",
    "kl": "kl",
    "tools/call_frequency": "tool_call_frequency",
    "tools/failure_frequency": "tool_failure_frequency",
    "completions/mean_length": "completion_mean_length",
    "completions/clipped_ratio": "completion_clipped_ratio",
    "sampling/sampling_logp_difference/mean": "logprob_diff_mean",
    "sampling/sampling_logp_difference/max": "logprob_diff_max",
    "sampling/importance_sampling_ratio/mean": "importance_weight_mean",
    "sampling/importance_sampling_ratio/min": "importance_weight_min",
    "sampling/importance_sampling_ratio/max": "importance_weight_max",
    "mean_token_accuracy": "mean_token_accuracy",
}


class StepDiagnostics(BaseModel):
    step: int
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    reward: float | None = None
    reward_std: float | None = Field(default=None, description="Std of rewards within a group, averaged.")
    zero_advantage_share: float | None = Field(default=None, description="Share of groups with identical rewards.")
    entropy: float | None = None
    kl: float | None = None
    tool_call_frequency: float | None = None
    tool_failure_frequency: float | None = None
    completion_mean_length: float | None = None
    completion_clipped_ratio: float | None = None
    logprob_diff_mean: float | None = Field(default=None, description="|rollout - trainer| logprob, mean (vLLM).")
    logprob_diff_max: float | None = None
    importance_weight_mean: float | None = None
    importance_weight_min: float | None = None
    importance_weight_max: float | None = None
    mean_token_accuracy: float | None = None


def check_step(d: StepDiagnostics, t: DiagnosticsThresholds) -> list[str]:
    """Threshold warnings for one step (empty when healthy)."""
    out: list[str] = []

    def bad(v: float | None) -> bool:
        return v is not None and not math.isfinite(v)

    for name in ("loss", "grad_norm", "reward"):
        if bad(getattr(d, name)):
            out.append(f"step {d.step}: {name} is {getattr(d, name)} (not finite)")
    if d.zero_advantage_share is not None and d.zero_advantage_share > t.max_zero_advantage_share:
        out.append(f"step {d.step}: {d.zero_advantage_share:.0%} of groups have zero advantage "
                   f"(> {t.max_zero_advantage_share:.0%}): little learning signal; raise num_generations or "
                   f"temperature, or pick tasks the student sometimes solves")
    if d.entropy is not None and d.entropy < t.min_entropy:
        out.append(f"step {d.step}: token entropy {d.entropy:.3f} < {t.min_entropy}: the policy is collapsing")
    if d.kl is not None and d.kl > t.max_kl:
        out.append(f"step {d.step}: KL {d.kl:.3f} > {t.max_kl}: drifting from the reference; raise beta")
    if d.grad_norm is not None and d.grad_norm > t.max_grad_norm:
        out.append(f"step {d.step}: grad norm {d.grad_norm:.1f} > {t.max_grad_norm}")
    if d.logprob_diff_mean is not None and d.logprob_diff_mean > t.max_logprob_diff:
        out.append(f"step {d.step}: rollout vs trainer logprob difference {d.logprob_diff_mean:.3f} > "
                   f"{t.max_logprob_diff}: generation and training disagree (dtype, kernels, stale weights)")
    if d.importance_weight_max is not None and d.importance_weight_max > t.max_importance_weight:
        out.append(f"step {d.step}: importance weight max {d.importance_weight_max:.2f} > {t.max_importance_weight}")
    return out


class DiagnosticsCallback(TrainerCallback):
    """Collects StepDiagnostics from every log event and warns on crossed thresholds."""

    def __init__(self, thresholds: DiagnosticsThresholds | None = None) -> None:
        self.thresholds = thresholds or DiagnosticsThresholds()
        self.steps: list[StepDiagnostics] = []
        self.warnings: list[str] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs or not any(k in logs for k in ("loss", "reward")):
            return
        fields: dict[str, Any] = {"step": int(state.global_step)}
        for k, f in _KEYS.items():
            v = logs.get(k)
            if isinstance(v, (int, float)):
                fields[f] = float(v)
        d = StepDiagnostics(**fields)
        self.steps.append(d)
        for w in check_step(d, self.thresholds):
            self.warnings.append(w)
            log.warning(w)

    def summary(self) -> dict[str, Any]:
        """Means over steps of the logged metrics, plus the warnings (for metrics_json and reports)."""
        out: dict[str, Any] = {"steps": len(self.steps), "warnings": list(self.warnings)}
        for f in StepDiagnostics.model_fields:
            if f == "step":
                continue
            vals = [getattr(d, f) for d in self.steps if getattr(d, f) is not None]
            if vals:
                out[f"{f}_mean"] = sum(vals) / len(vals)
                out[f"{f}_last"] = vals[-1]
        return out
