"""Typed configuration of the training stages (SFT, GRPO), of the student (its base and how it generates) and of
the tiny offline student.

Pydantic models with a description on every field: they are Prefect flow parameters (forms in the UI), TOML
sections of a run config, and the single place where defaults live. Defaults are the measured offline default
(tiny student, arithmetic, 2 CPU cores); GPU users raise sizes. This module trains nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TINY_FAMILIES = ("tiny", "tiny-gptoss", "tiny-qwen3")  # student.base names of training/tiny.py's FAMILIES
# The SFT peak learning rate each tiny family learns at after its copy warm-up: flows.config.load_config uses it
# when a config picks the family and leaves sft.learning_rate unset. GPT-OSS's mixture-of-experts student stalls
# at 5e-3 (it copies no operand; benchmarks/gptoss_learns.py) and learns at 1e-3.
TINY_SFT_LEARNING_RATES = {"tiny": 5e-3, "tiny-gptoss": 1e-3, "tiny-qwen3": 5e-3}
COPY_WARMUP_LEARNING_RATE = 1e-3  # TinyModelConfig.copy_warmup_learning_rate's default (training/warmup.py's too)


class TinyModelConfig(BaseModel):
    """Size of the tiny student built from scratch for offline runs (training/tiny.py)."""

    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(default=128, gt=0, description="Hidden size of the model (every family).")
    layers: int = Field(default=4, gt=0, description="Number of transformer layers.")
    heads: int = Field(default=4, gt=0, description="Attention heads (hidden must divide by it).")
    kv_heads: int = Field(default=2, gt=0, description="Key/value heads (grouped-query attention).")
    vocab_size: int = Field(default=2048, gt=300, description="Target BPE vocabulary size of the corpus tokenizer.")
    rare_word_share: float = Field(default=0.0, ge=0, lt=1, description="A word in fewer than this share (0-1) of "
                                   "the train tasks' texts is rare: a name coined for one task, not the wording the "
                                   "tasks share. The tokenizer learns no merges from rare words, so they spell out "
                                   "in letters and short common pieces in train and held-out tasks alike, as a "
                                   "pretrained tokenizer splits a name it never saw; and the copy warm-up echoes "
                                   "every other prompt with its rare words re-coined in random letters, which only "
                                   "copying can echo. 0: every word shapes the tokenizer, prompts are echoed as "
                                   "they are.")
    experts: int = Field(default=4, ge=1, description="Experts per MoE layer (tiny-gptoss only).")
    experts_per_token: int = Field(default=2, ge=1, description="Experts each token is routed to, top-k "
                                   "(tiny-gptoss only; must not exceed experts).")
    seed: int = Field(default=0, description="Seed of the random initial weights.")
    copy_warmup_steps: int = Field(default=400, ge=0, description="Steps of echoing the train prompts after the "
                                   "random init (training/warmup.py), so that the base can copy from context as "
                                   "every pretrained model can; it never shows a chat turn or a tool call (the base "
                                   "still scores 0%). 400 steps (~50 s on one core) remove the ~1,000-step loss "
                                   "plateau of SFT; 0 keeps the random weights.")
    copy_warmup_batch_size: int = Field(default=32, gt=0, description="Prompts per copy warm-up step (each echoed "
                                        "once); a step costs in proportion to it and to the prompts' length.")
    copy_warmup_learning_rate: float = Field(default=COPY_WARMUP_LEARNING_RATE, gt=0, description="Peak learning "
                                             "rate of the copy warm-up (AdamW; a 30-step linear ramp, then "
                                             "constant).")


class StudentConfig(BaseModel):
    """The student: the base model and how it generates in evaluations and rollouts."""

    model_config = ConfigDict(extra="forbid")
    base: str = Field(default="tiny", description="A tiny student built from the task corpus: 'tiny' (Qwen2-style), "
                      "'tiny-gptoss' (GPT-OSS: MoE, attention sinks, sliding window, harmony template) or "
                      "'tiny-qwen3' (Qwen3, <think> template); or a model folder / hub id.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Size of the tiny base student.")
    max_new_tokens: int = Field(default=64, gt=0, description="Most tokens per assistant turn (fewer when the "
                                "model's context has less room left).")
    batch_size: int = Field(default=64, gt=0, description="Concurrent episodes batched into one generate call.")
    threads: int | None = Field(default=1, description="torch CPU threads for generation (1 is fastest for tiny "
                                                       "models on a shared CPU).")
    rollout_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="Precision the student generates in (evaluations, rollouts, their stored "
        "logprobs): 'auto' keeps the checkpoint's own (float32 for the tiny students); 'bfloat16' is what a serving "
        "engine (vLLM) runs, so the mismatch panel sees an engine's gap.")
    train_attention: Literal["eager", "sdpa_sinks", "sdpa_nosinks"] = Field(
        default="eager", description="Attention kernel the trainer runs (SFT, GRPO, the mismatch panel's trainer "
        "pass; training/attention.py): 'eager' is transformers' own (sink-aware for GPT-OSS) and what rollouts run; "
        "'sdpa_sinks' is torch SDPA with GPT-OSS's attention sinks honoured; 'sdpa_nosinks' drops them, a stand-in "
        "for a kernel without sink support (the GPT-OSS retrospective's bug, to reproduce on purpose).")
    thinking: bool | None = Field(default=None, description="The chat template's enable_thinking switch when the "
                                  "student generates (Qwen3: false prefills an empty <think></think> block, so the "
                                  "reply is the answer); None leaves the template's default (thinking on).")

    @field_validator("base")
    @classmethod
    def _known_tiny(cls, v: str) -> str:
        if v.startswith("tiny") and v not in TINY_FAMILIES and not Path(v).exists():
            raise ValueError(f"student.base={v!r} is no tiny family ({', '.join(TINY_FAMILIES)}) and no model "
                             f"folder; pick one of those or give a folder / hub id")
        return v


class SFTConfig(BaseModel):
    """Supervised fine-tuning on a training snapshot (multi-turn, with tools, loss on assistant tokens only)."""

    model_config = ConfigDict(extra="forbid")
    epochs: float = Field(default=3.0, gt=0, description="Passes over the snapshot (ignored when max_steps > 0).")
    max_steps: int = Field(default=-1, description="Stop after this many optimiser steps; -1 means use epochs.")
    batch_size: int = Field(default=16, gt=0, description="Examples per device per optimiser step (before accumulation).")
    grad_accum: int = Field(default=1, gt=0, description="Gradient accumulation steps.")
    learning_rate: float = Field(default=3e-3, gt=0, description="Peak learning rate (tiny models want ~1e-3..5e-3, "
                                                                    "pretrained ones ~1e-5).")
    lr_scheduler: str = Field(default="cosine", description="transformers scheduler name, e.g. cosine, linear, "
                                                             "constant_with_warmup.")
    warmup_ratio: float = Field(default=0.05, ge=0, le=1, description="Share of steps spent warming up.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    max_length: int = Field(default=512, gt=0, description="Token budget of one example; examples whose assistant "
                                                           "tokens all fall past it are dropped and counted.")
    assistant_only_loss: bool = Field(default=True, description="Train only on assistant tokens (tool calls, answers).")
    packing: bool = Field(default=False, description="Pack examples into max_length rows (pays with many short "
                                                     "examples on a GPU with flash attention; off on CPU).")
    seed: int = Field(default=0, description="Seed of data order and initialisation of anything random.")
    logging_steps: int = Field(default=1, gt=0, description="Log the loss every N steps.")
    threads: int | None = Field(default=1, description="torch CPU threads for this process; None keeps torch's "
                                                     "default. 1 is fastest for tiny models on a shared CPU: with "
                                                     "2 threads OpenMP spin-waits cost ~9x the CPU per step.")
    bf16: bool = Field(default=False, description="bfloat16 mixed precision (GPU).")
    gradient_checkpointing: bool = Field(default=False, description="Recompute activations to save memory (TRL's "
                                         "default is on): worth it for large models, ~30% slower for tiny ones.")
    late_sources: list[str] = Field(default=[], description="Sources (the record's `source`: human, teacher, "
                                    "student) whose rows train only in a last phase of late_steps steps, mixed with "
                                    "all the others; the first phase trains on the others alone. [] (the default) "
                                    "trains on one shuffled mix.")
    late_steps: int = Field(default=150, gt=0, description="Optimiser steps of the last phase (late_sources only); "
                            "they count within max_steps, which must be larger.")
    late_learning_rate: float = Field(default=2e-3, gt=0, description="Peak learning rate of the last phase, with "
                                      "its own warm-up and schedule (late_sources only).")
    late_max_share: float = Field(default=0.3, gt=0, le=1, description="At most this share of the last phase's "
                                  "examples comes from late_sources (a seeded sample of them when there are more).")

    def late_phase_problem(self, key: str, steps: int | None) -> str | None:
        """Why a round of `steps` SFT steps (named by config key `key`) cannot hold the late phase; None when it
        can, or when there is no late phase or no step count."""
        if not self.late_sources or steps is None or steps > self.late_steps:
            return None
        return (f"sft.late_sources needs {key} ({steps}) above sft.late_steps ({self.late_steps}); raise {key} or "
                f"lower sft.late_steps")


class GRPOConfig(BaseModel):
    """Group-relative policy optimisation with our sandboxes as the environment and our verifiers as reward."""

    model_config = ConfigDict(extra="forbid")
    num_generations: int = Field(default=8, ge=2, description="Group size: completions sampled per prompt.")
    prompts_per_step: int = Field(default=2, gt=0, description="Distinct tasks per optimiser step; the generation "
                                                               "batch is prompts_per_step * num_generations.")
    max_steps: int = Field(default=20, gt=0, description="Optimiser steps.")
    learning_rate: float = Field(default=1e-4, gt=0, description="Peak learning rate (tiny models <= 1e-4, pretrained "
                                 "~1e-6). Measured on the tiny student: one step at 5e-4 overshoots (the update check "
                                 "warns), 1e-5..1e-4 steps raise the rewarded completions' probability.")
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1, description="Share of steps over which the learning rate "
                                "ramps up from 0. Adam's first steps move every weight by ~learning_rate whatever "
                                "the gradient's size, so with a few noisy groups an unwarmed first step can undo "
                                "what SFT learned (measured: one step at 5e-4 lowered the rewarded completions' "
                                "log-probability by 4.6 nats).")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient against the reference (SFT) model; 0 skips "
                                                       "the reference model.")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field(default="dapo", description="TRL loss type.")
    epsilon: float = Field(default=0.2, gt=0, description="PPO clip range (lower).")
    num_iterations: int = Field(default=1, ge=1, description="Optimisation passes per generation batch.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling of rollouts.")
    max_completion_length: int = Field(default=128, gt=0, description="Token budget of all assistant turns and tool "
                                                                      "results of one episode.")
    max_tool_calling_iterations: int = Field(default=3, ge=1, description="Tool calls allowed per episode.")
    scale_rewards: Literal["group", "batch", "none"] = Field(default="group", description="Advantage normalisation.")
    seed: int = Field(default=0, description="Seed of sampling and data order.")
    logging_steps: int = Field(default=1, gt=0, description="Log every N steps.")
    threads: int | None = Field(default=1, description="torch CPU threads for this process; None keeps torch's "
                                                     "default. 1 is fastest for tiny models on a shared CPU: with "
                                                     "2 threads OpenMP spin-waits cost ~9x the CPU per step.")
    use_vllm: bool = Field(default=False, description="Generate with vLLM (needs the `gpu` extra and a CUDA GPU).")
    vllm_mode: Literal["colocate", "server"] = Field(default="colocate", description="vLLM inside the trainer "
                                                                                       "process or a separate server.")
    vllm_server_base_url: str | None = Field(default=None, description="URL of `trl vllm-serve` in server mode.")
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1, description="GPU share vLLM may take "
                                                                                     "(colocate).")
    bf16: bool = Field(default=False, description="bfloat16 mixed precision (GPU).")
    sandbox_timeout_s: float = Field(default=10.0, gt=0, description="Wall-clock limit of one tool call.")
    harbor_reuse: bool = Field(default=True, description="A Harbor task's generations reuse containers of its "
                               "image: one whose episode was graded is reset (processes killed; what changed under "
                               "the task's working directory, state paths, /tmp, /solution, /tests and /logs put "
                               "back as the image has it) and plays a later generation of the same image; one "
                               "changed anywhere else is removed (sandbox/taskenv.py). Off, or sandbox.reuse=false: "
                               "a fresh container per generation. The grader always runs in a fresh container.")
    reward_strengths: list[Literal["data", "isolated", "harbor", "bfcl", "llm", "env"]] = Field(
        default=["data", "isolated", "harbor", "bfcl"], min_length=1,
        description="Verdict strengths whose reward GRPO uses (the record's verifier_strength): 'data' (computed "
                    "outside the sandbox from plain results or answers), 'isolated' (tests run apart from the "
                    "solution's process), 'harbor' (a Harbor task's test.sh in a fresh container of its image), "
                    "'bfcl' (BFCL's checker in a fresh sandbox), 'llm' (an LLM judge), 'env' (an OpenEnv "
                    "environment's own reward). An episode judged another way scores None (TRL leaves it out) and is "
                    "counted as weak_verdict.")
    update_check: bool = Field(default=True, description="Measure what each step's update did to the log-"
                               "probability of its own rewarded and unrewarded completions, and warn when it "
                               "lowered the rewarded ones (training/diagnostics.py UpdateCheck); two extra forward "
                               "passes per step, no generation.")


class DiagnosticsThresholds(BaseModel):
    """When to warn during training (training/diagnostics.py)."""

    model_config = ConfigDict(extra="forbid")
    max_zero_advantage_share: float = Field(default=0.9, ge=0, le=1, description="Warn when more groups than this "
                                                                                 "share have identical rewards.")
    min_entropy: float = Field(default=0.05, ge=0, description="Warn when mean token entropy falls below this "
                               "(collapse) and below entropy_drop_ratio x the first step's entropy.")
    entropy_drop_ratio: float = Field(default=0.5, gt=0, le=1, description="The entropy warning also needs the "
                                      "entropy to have fallen below this share of the first logged step's: a student "
                                      "that starts sharp after SFT (0.02-0.03 measured on the tiny one) is not "
                                      "collapsing, and warning on every step buried the warnings that mattered.")
    max_kl: float = Field(default=1.0, ge=0, description="Warn when KL to the reference exceeds this.")
    max_grad_norm: float = Field(default=100.0, gt=0, description="Warn when the gradient norm exceeds this.")
    stop_grad_norm: float = Field(default=1000.0, gt=0, description="Stop GRPO when a step's gradient norm (before "
                                  "clipping) exceeds this or is not finite: the norms have exploded (the GPT-OSS "
                                  "retrospective saw ~1,500 before its fix); the stopped stage's checkpoint is not "
                                  "used. inf never stops.")
    max_logprob_diff: float = Field(default=0.5, ge=0, description="Warn when |rollout - trainer| logprob mean "
                                                                   "difference exceeds this (vLLM only).")
    max_importance_weight: float = Field(default=5.0, gt=0, description="Warn when the max importance weight "
                                                                       "exceeds this (vLLM only).")
    max_rewarded_logp_drop: float = Field(default=0.5, ge=0, description="Warn when a GRPO step lowers the mean "
                                          "log-probability of its own positive-advantage completions by more than "
                                          "this many nats (the step overshoots; needs GRPOConfig.update_check).")


class MismatchThresholds(BaseModel):
    """When the mismatch panel (training/mismatch.py) refuses to promote a checkpoint to the next round."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=True, description="Compute the panel over the round's student rollouts that "
                          "carry logprobs and refuse promotion when a threshold below is crossed.")
    max_token_mult_prob_error: float = Field(default=1.1, ge=1.0, description="Refuse at or above this NeMo-RL "
                                             "token_mult_prob_error (mean of exp|Δlogp|); NeMo-RL's CI fails a run "
                                             "whose median reaches 1.1.")
    max_mean_abs_logp_diff: float = Field(default=0.1, ge=0, description="Refuse above this mean |trainer - "
                                          "rollout| log-probability per token (nats).")
    min_pearson: float = Field(default=-1.0, ge=-1, le=1, description="Refuse below this Pearson correlation of "
                               "trainer and rollout log-probabilities; -1: never (the default: a confident student's "
                               "log-probabilities sit near 0 with little spread, so the correlation is low while "
                               "every token agrees; the panel still reports it).")
    max_clip_fraction: float = Field(default=0.0, ge=0, le=1, description="Refuse above this clip fraction of the "
                                     "first on-policy mini-batch (it must be 0; more is the MoE symptom).")

