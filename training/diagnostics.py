"""Training diagnostics: per-step health metrics collected from TRL's logs, with warnings when thresholds are crossed.

`DiagnosticsCallback` is a transformers TrainerCallback. At each log event it keeps one `StepDiagnostics` row:
loss, grad norm, learning rate, and for GRPO the mean reward, reward std within groups, the share of groups whose
rewards are all equal (zero advantage: no learning signal), token entropy, KL to the reference, tool-call and
tool-failure frequencies, and, when rollout logprobs exist (vLLM generation), the rollout-vs-trainer logprob
difference and importance-sampling weights (the GPT-OSS retrospective's silent collapse). A crossed threshold
(training.config.DiagnosticsThresholds) logs a warning and is recorded in `warnings` for the report; with
`stop=True` (GRPO) a gradient norm above `stop_grad_norm`, or not finite, also stops training and says why in
`stopped`.

`UpdateCheck` (GRPO) measures what each optimiser step did to the policy: the change in log-probability of the
step's own completions (trained tokens only), for those with a positive advantage and those with a negative one.
A healthy step raises the first and lowers the second; a step that lowers the rewarded completions overshoots (the
learning rate is too high for the batch's signal) -- the failure that made GRPO lower the tiny student's reward at
lr 5e-4 while its loss looked fine. It costs two forward passes of the batch per step (no generation).
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
    "clip_ratio/region_mean": "clip_fraction",
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
    clip_fraction: float | None = Field(default=None, description="Share of completion tokens whose PPO ratio was "
                                        "clipped (TRL's clip_ratio/region_mean); 0 on an exactly on-policy step, "
                                        "where TRL takes old_logp = logp.detach() (training/mismatch.py).")
    mean_token_accuracy: float | None = None
    update_logp_pos: float | None = Field(default=None, description="Mean change of the log-probability of this "
                                          "step's positive-advantage completions made by its update (nats).")
    update_logp_neg: float | None = Field(default=None, description="The same for negative-advantage completions.")
    update_agreement: float | None = Field(default=None, description="Share of non-zero-advantage completions "
                                           "whose log-probability moved in the direction of their advantage.")


def check_step(d: StepDiagnostics, t: DiagnosticsThresholds, first_entropy: float | None = None) -> list[str]:
    """Threshold warnings for one step (empty when healthy); `first_entropy` is the run's first logged entropy."""
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
    if d.entropy is not None and d.entropy < t.min_entropy and (
            first_entropy is None or d.entropy < t.entropy_drop_ratio * first_entropy):
        out.append(f"step {d.step}: token entropy {d.entropy:.3f} < {t.min_entropy}"
                   + (f" (first step {first_entropy:.3f})" if first_entropy is not None else "")
                   + ": the policy is collapsing")
    if d.kl is not None and d.kl > t.max_kl:
        out.append(f"step {d.step}: KL {d.kl:.3f} > {t.max_kl}: drifting from the reference; raise beta")
    if d.grad_norm is not None and d.grad_norm > t.max_grad_norm:
        out.append(f"step {d.step}: grad norm {d.grad_norm:.1f} > {t.max_grad_norm}")
    if d.logprob_diff_mean is not None and d.logprob_diff_mean > t.max_logprob_diff:
        out.append(f"step {d.step}: rollout vs trainer logprob difference {d.logprob_diff_mean:.3f} > "
                   f"{t.max_logprob_diff}: generation and training disagree (dtype, kernels, stale weights)")
    if d.importance_weight_max is not None and d.importance_weight_max > t.max_importance_weight:
        out.append(f"step {d.step}: importance weight max {d.importance_weight_max:.2f} > {t.max_importance_weight}")
    if d.update_logp_pos is not None and d.update_logp_pos < -t.max_rewarded_logp_drop:
        out.append(f"step {d.step}: the update lowered the log-probability of the rewarded completions by "
                   f"{-d.update_logp_pos:.2f} nats (> {t.max_rewarded_logp_drop}): the step overshoots; lower "
                   f"learning_rate or raise prompts_per_step")
    return out


class DiagnosticsCallback(TrainerCallback):
    """Collects StepDiagnostics from every log event and warns on crossed thresholds."""

    def __init__(self, thresholds: DiagnosticsThresholds | None = None,
                 update_check: UpdateCheck | None = None, *, stop: bool = False) -> None:
        self.thresholds = thresholds or DiagnosticsThresholds()
        self.update_check = update_check
        self.stop = stop
        self.stopped: str | None = None
        self.steps: list[StepDiagnostics] = []
        self.warnings: list[str] = []
        self._first_entropy: float | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs or not any(k in logs for k in ("loss", "reward")):
            return
        fields: dict[str, Any] = {"step": int(state.global_step)}
        for k, f in _KEYS.items():
            v = logs.get(k)
            if isinstance(v, (int, float)):
                fields[f] = float(v)
        if self.update_check is not None:
            fields.update(self.update_check.take())
        d = StepDiagnostics(**fields)
        self.steps.append(d)
        if self._first_entropy is None:
            self._first_entropy = d.entropy
        for w in check_step(d, self.thresholds, self._first_entropy):
            self.warnings.append(w)
            log.warning(w)
        g = d.grad_norm
        if self.stop and self.stopped is None and g is not None and not g <= self.thresholds.stop_grad_norm:
            self.stopped = (f"step {d.step}: grad norm {g:.1f} > stop_grad_norm {self.thresholds.stop_grad_norm:g}: "
                            f"training stopped, the gradient norms exploded (a trainer/rollout mismatch or a "
                            f"learning rate too high)")
            log.warning(self.stopped)
            control.should_training_stop = True

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


class UpdateCheck(TrainerCallback):
    """Log-probability change of each step's completions caused by that step's update (GRPO; see module docstring).

    The trainer calls `before(model, batch)` with every training batch before its forward pass; at the end of the
    optimiser step (`on_step_end`) the same batches are scored again and `take()` hands the step's means to
    DiagnosticsCallback. `score(model, batch)` (set by the trainer) returns per-completion log-probabilities summed
    over trained tokens.
    """

    def __init__(self, score: Any = None) -> None:
        self.score = score
        self._pending: list[tuple[dict[str, Any], Any]] = []
        self._result: dict[str, float] = {}

    def before(self, model: Any, batch: dict[str, Any]) -> None:
        self._pending.append((batch, self.score(model, batch)))

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        import torch

        if not self._pending or model is None:
            return
        deltas, advantages = [], []
        for batch, before in self._pending:
            deltas.append(self.score(model, batch) - before)
            adv = batch["advantages"]
            advantages.append(adv if adv.dim() == 1 else adv.mean(-1))
        self._pending.clear()
        delta, adv = torch.cat(deltas).float(), torch.cat(advantages).float().to(deltas[0].device)
        pos, neg = adv > 0, adv < 0
        res: dict[str, float] = {}
        if pos.any():
            res["update_logp_pos"] = float(delta[pos].mean())
        if neg.any():
            res["update_logp_neg"] = float(delta[neg].mean())
        moved = pos | neg
        if moved.any():
            res["update_agreement"] = float(((delta * adv.sign())[moved] > 0).float().mean())
        self._result = res

    def take(self) -> dict[str, float]:
        res, self._result = self._result, {}
        return res
