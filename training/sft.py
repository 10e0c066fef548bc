"""Supervised fine-tuning of a student on trajectories (a training snapshot), with TRL's SFTTrainer.

Each trajectory becomes one multi-turn conversation with its tool schemas (warehouse.chat.to_template, the one
conversation codec), rendered by the model's chat template
(TRL's training variant with generation markers) and tokenized here, so that the loss covers assistant tokens only
and examples the token budget would cut are counted instead of silently vanishing (TRL drops an example whose
assistant tokens all fall past max_length without a word). The trained model is saved as an ordinary model
folder. With SFTConfig.late_sources, the rows of those sources train only in a last phase (sft_phases). This module
does not choose the data (curation does) and does not register checkpoints (registry.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from pydantic import BaseModel, Field

from training.attention import use_attention
from training.config import SFTConfig
from warehouse import chat
from warehouse.record import Trajectory, example_key


class TrainingError(RuntimeError):
    """Training cannot start or went wrong (no usable examples, bad model path); the message names the input."""


class SFTResult(BaseModel):
    checkpoint_path: str = Field(description="Model folder of the trained student (save_pretrained).")
    losses: list[float] = Field(description="Training loss at each logged step, in order.")
    steps: int
    wall_s: float = Field(description="Seconds spent in trainer.train() (excludes loading and saving).")
    total_s: float = Field(description="Seconds of the whole call.")
    n_rows: int = Field(description="Trajectories given.")
    n_examples: int = Field(description="Examples trained on.")
    n_dropped_truncated: int = Field(description="Dropped: no assistant token left within max_length.")
    n_dropped_malformed: int = Field(description="Dropped: tool-call arguments not a JSON object, or no assistant turn.")
    n_truncated: int = Field(description="Kept but cut at max_length (some assistant tokens lost).")
    n_tokens: int = Field(description="Tokens in the training examples (after truncation).")
    n_loss_tokens: int = Field(description="Tokens that carry loss (assistant tokens).")
    dropped_ids: list[str] = Field(default_factory=list, description="Trajectory ids dropped, for the report.")
    per_suite: dict[str, dict[str, int]] = Field(default_factory=dict, description=(
        "Per task suite: examples kept, truncated and dropped (and why), tokens, loss tokens, the kept episodes' "
        "assistant turns and those trained (training.sft.SUITE_COUNTS)."))
    diagnostics: dict[str, Any] = Field(default_factory=dict, description="Summary of step diagnostics (grad norm, "
                                                                          "entropy, token accuracy, warnings).")


def trajectory_conversation(row: Trajectory, *, template: str | dict | None = None
                            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a trajectory as chat templates expect them (warehouse.chat.to_template: tool-call
    arguments as objects, stored reasoning where `template` renders it: harmony's analysis channel, Qwen3's
    `reasoning_content`, else inline as `<think>` in the content). Raises warehouse.chat.ConversationError for a
    row that cannot be rendered faithfully (a malformed call, arguments that are not a JSON object) or that holds
    an empty assistant turn: SFT counts it as dropped_malformed, never imitates it."""
    if any(m.role == "assistant" and chat.is_empty(m) for m in row.messages):
        raise chat.ConversationError(f"trajectory {row.trajectory_id} has an empty assistant turn")
    return chat.to_template(row.messages, template=template), json.loads(row.tools_json or "[]")


def load_snapshot(root: str, snapshot_id: str) -> list[Trajectory]:
    """The trajectories of a training snapshot (its manifest joined to the trajectories view), ordered by example
    key (warehouse.record.example_key: run-independent), so a re-run of the same snapshot (a resumed flywheel,
    another run of the same config and seed, another lake holding the same rows) trains on the same order, whatever
    the rows' write times and the run's id."""
    from warehouse.query import read_trajectories

    rows = read_trajectories(root, "trajectory_id IN (SELECT trajectory_id FROM manifests WHERE snapshot_id = ?)",
                             [snapshot_id])
    if not rows:
        raise TrainingError(f"snapshot {snapshot_id!r} under {root!r} has no trajectories; check the id with "
                            f"`flywheel sql --root {root}` (SELECT * FROM datasets)")
    return sorted(rows, key=example_key)


def render_conversation(tokenizer, msgs: list[dict[str, Any]], tools: list[dict[str, Any]],
                        template: str | None, *, mask: bool = True, generation_prompt: bool = False
                        ) -> tuple[list[int], list[int]]:
    """(token ids, assistant mask) of a conversation rendered with `template` (None: the tokenizer's own), the
    one rendering SFT trains on and the drift preflight (training/preflight.py) compares with stored ids. The mask
    is all ones without `mask`."""
    enc = tokenizer.apply_chat_template(msgs, tools=tools or None, chat_template=template, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=mask,
                                        add_generation_prompt=generation_prompt)
    ids = list(enc["input_ids"])
    return ids, (list(enc["assistant_masks"]) if mask else [1] * len(ids))


def training_template(tokenizer) -> str | None:
    """The template SFT renders with: TRL's training variant (with generation markers) of the tokenizer's chat
    template, or None when the tokenizer's own already has the markers. TrainingError when TRL knows none."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if has_generation_markers(tokenizer.chat_template):
        return None
    tmpl = get_training_chat_template(tokenizer)
    if tmpl is None:
        raise TrainingError("the model's chat template has no {% generation %} markers and TRL knows no training "
                            "variant of it; set SFTConfig.assistant_only_loss=False or use a template TRL ships")
    return tmpl


SUITE_COUNTS = ("examples", "truncated", "dropped_truncated", "dropped_malformed", "tokens", "loss_tokens",
                "assistant_turns", "trained_turns")


def loss_spans(labels: list[int]) -> int:
    """Runs of loss-carrying labels (not -100) in an example: one per assistant turn the template marks, so an
    episode's trained turns (fewer than its assistant turns when max_length cut some)."""
    return sum(1 for i, lab in enumerate(labels) if lab != -100 and (i == 0 or labels[i - 1] == -100))


def tokenize_rows(tokenizer, rows: list[Trajectory], cfg: SFTConfig) -> tuple[dict[str, list], dict[str, Any]]:
    """Tokenize trajectories into input_ids/labels (-100 outside assistant turns), truncated at max_length.

    Every assistant turn of a multi-turn episode carries loss; system, user (later turns too) and tool messages do
    not. Returns the columns and counts of what was kept, cut and dropped (with the dropped ids, the source of each
    kept example in order, and `per_suite`: SUITE_COUNTS per task suite, where `assistant_turns` counts the kept
    episodes' assistant turns and `trained_turns` those that kept loss-carrying tokens within max_length).
    """
    template = training_template(tokenizer) if cfg.assistant_only_loss else None
    ids_col: list[list[int]] = []
    labels_col: list[list[int]] = []
    per_suite: dict[str, dict[str, int]] = {}
    dropped_ids: list[str] = []
    kept_sources: list[str] = []

    def drop(row: Trajectory, why: str, suite: dict[str, int]) -> None:
        suite[why] += 1
        dropped_ids.append(row.trajectory_id)

    for row in rows:
        suite = per_suite.setdefault(row.suite, dict.fromkeys(SUITE_COUNTS, 0))
        try:
            msgs, tools = trajectory_conversation(row, template=tokenizer.chat_template)
        except chat.ConversationError:
            drop(row, "dropped_malformed", suite)
            continue
        if not any(m["role"] == "assistant" for m in msgs):
            drop(row, "dropped_malformed", suite)
            continue
        try:
            ids, mask = render_conversation(tokenizer, msgs, tools, template, mask=cfg.assistant_only_loss)
        except TemplateError:  # the chat template itself refuses the conversation: a bad row, counted
            drop(row, "dropped_malformed", suite)
            continue
        labels = [t if b else -100 for t, b in zip(ids, mask)]
        cut = len(ids) > cfg.max_length
        if cut:
            ids, labels = ids[: cfg.max_length], labels[: cfg.max_length]
            if all(lab == -100 for lab in labels):
                drop(row, "dropped_truncated", suite)
                continue
        if all(lab == -100 for lab in labels):
            drop(row, "dropped_malformed", suite)
            continue
        ids_col.append(ids)
        labels_col.append(labels)
        kept_sources.append(row.source)
        for key, n in (("examples", 1), ("truncated", int(cut)), ("tokens", len(ids)),
                       ("loss_tokens", sum(1 for lab in labels if lab != -100)),
                       ("assistant_turns", sum(1 for m in msgs if m["role"] == "assistant")),
                       ("trained_turns", loss_spans(labels) if cfg.assistant_only_loss else 0)):
            suite[key] += n
    totals = {k: sum(c[k] for c in per_suite.values())
              for k in ("dropped_truncated", "dropped_malformed", "truncated", "tokens", "loss_tokens")}
    stats = {**totals, "dropped_ids": dropped_ids, "kept_sources": kept_sources, "per_suite": per_suite}
    return {"input_ids": ids_col, "labels": labels_col}, stats


def sft_phases(cols: dict[str, list], sources: list[str], cfg: SFTConfig
               ) -> list[tuple[dict[str, list], int, float]]:
    """(columns, max_steps, peak learning rate) of each training phase: one over every example; or, with
    cfg.late_sources and examples of both kinds, a first phase of max_steps - late_steps over the other sources'
    examples and a last one of late_steps at late_learning_rate over all of them, the late sources' examples
    sampled (seeded) down to late_max_share of that phase. TrainingError when the late phase cannot fit (max_steps
    not above late_steps)."""
    late = set(cfg.late_sources)
    is_late = [src in late for src in sources]
    if not late or all(is_late) or not any(is_late):
        return [(cols, cfg.max_steps, cfg.learning_rate)]
    if problem := cfg.late_phase_problem("sft.max_steps", cfg.max_steps):
        raise TrainingError(problem)
    early_idx = [i for i, lt in enumerate(is_late) if not lt]
    late_idx = [i for i, lt in enumerate(is_late) if lt]
    if cfg.late_max_share < 1:
        cap = math.floor(cfg.late_max_share * len(early_idx) / (1 - cfg.late_max_share))
        if len(late_idx) > cap:
            late_idx = random.Random(cfg.seed).sample(late_idx, cap)

    def take(idx: list[int]) -> dict[str, list]:
        return {k: [col[i] for i in sorted(idx)] for k, col in cols.items()}

    return [(take(early_idx), cfg.max_steps - cfg.late_steps, cfg.learning_rate),
            (take(early_idx + late_idx), cfg.late_steps, cfg.late_learning_rate)]


def router_logits_off(model: Any) -> None:
    """Stop a mixture-of-experts model (GPT-OSS) returning router logits outside the training forward pass.

    TRL's trainers turn `config.output_router_logits` on for the load-balancing loss; saved that way, generation
    with a KV cache computes the loss over the whole attention mask against one step's router logits and crashes
    (transformers 5.24, GPT-OSS). The trainers pass the flag explicitly where they need the loss."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "output_router_logits", False):
        config.output_router_logits = False


def _device_kwargs(bf16: bool) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    return {"use_cpu": not cuda, "bf16": bool(bf16 and cuda)}


def train_sft(model_path: str | Path, rows: list[Trajectory] | None, out_dir: str | Path, cfg: SFTConfig, *,
              snapshot_id: str | None = None, root: str | None = None, progress: bool = True,
              callbacks: list | None = None, attention: str = "eager") -> SFTResult:
    """Fine-tune `model_path` (a local folder or hub id) on `rows` (or on snapshot `snapshot_id` of lake `root`).

    Saves the student to `out_dir` (model + tokenizer) and returns the loss curve and drop counts. Seeded: the same
    inputs and config give the same loss sequence on the same machine. `attention` is the trainer's attention kernel
    (training/attention.py; student.train_attention).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    from training.config import DiagnosticsThresholds
    from training.diagnostics import DiagnosticsCallback

    t0 = time.perf_counter()
    if rows is None:
        if snapshot_id is None or root is None:
            raise TrainingError("train_sft needs rows, or snapshot_id together with root")
        rows = load_snapshot(root, snapshot_id)
    if not rows:
        raise TrainingError("train_sft got no trajectories: the snapshot is empty; curate one first")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    set_seed(cfg.seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    except OSError as e:
        raise TrainingError(f"cannot load a tokenizer from {model_path!r}: {e}") from e
    cols, stats = tokenize_rows(tokenizer, rows, cfg)
    if not cols["input_ids"]:
        raise TrainingError(f"all {len(rows)} trajectories were dropped ({stats['dropped_truncated']} past "
                            f"max_length={cfg.max_length}, {stats['dropped_malformed']} malformed); raise "
                            f"SFTConfig.max_length or check the snapshot")
    phases = sft_phases(cols, stats["kept_sources"], cfg)
    model = use_attention(AutoModelForCausalLM.from_pretrained(str(model_path)), attention)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # low entropy is SFT's goal (confident imitation), not a collapse: only GRPO warns on it
    diag = DiagnosticsCallback(DiagnosticsThresholds(min_entropy=0.0))
    losses: list[float] = []
    steps, wall = 0, 0.0
    with tempfile.TemporaryDirectory(prefix="flywheel-sft-") as scratch:
        for phase_cols, max_steps, lr in phases:
            args = TRLSFTConfig(
                output_dir=scratch, num_train_epochs=cfg.epochs, max_steps=max_steps,
                per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
                gradient_checkpointing=cfg.gradient_checkpointing,
                learning_rate=lr, lr_scheduler_type=cfg.lr_scheduler, warmup_steps=cfg.warmup_ratio,
                weight_decay=cfg.weight_decay, max_length=cfg.max_length, packing=cfg.packing,
                packing_strategy="wrapped" if cfg.packing else "bfd",
                seed=cfg.seed, data_seed=cfg.seed, logging_steps=cfg.logging_steps, save_strategy="no",
                report_to="none", disable_tqdm=not progress, dataloader_num_workers=0,
                **_device_kwargs(cfg.bf16),
            )
            trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict(phase_cols),
                                 processing_class=tokenizer, callbacks=[diag, *(callbacks or [])])
            t1 = time.perf_counter()
            trainer.train()
            wall += time.perf_counter() - t1
            losses += [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
            steps += int(trainer.state.global_step)
            model = trainer.model
        router_logits_off(trainer.model)
        trainer.save_model(str(out))
        tokenizer.save_pretrained(str(out))
    return SFTResult(
        checkpoint_path=str(out), losses=losses, steps=steps, wall_s=wall,
        total_s=time.perf_counter() - t0, n_rows=len(rows), n_examples=len(cols["input_ids"]),
        n_dropped_truncated=stats["dropped_truncated"], n_dropped_malformed=stats["dropped_malformed"],
        n_truncated=stats["truncated"], n_tokens=stats["tokens"], n_loss_tokens=stats["loss_tokens"],
        dropped_ids=stats["dropped_ids"], per_suite=stats["per_suite"], diagnostics=diag.summary(),
    )


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
