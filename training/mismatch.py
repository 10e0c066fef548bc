"""The mismatch panel: how far the trainer's log-probabilities are from the ones the rollout sampled with.

On-policy RL assumes the tokens were sampled from the policy being trained. A rollout engine (vLLM, a batched
`generate` with a KV cache, bf16) and the trainer (a teacher-forced forward pass, fp32, another batch composition)
compute slightly different log-probabilities for the same tokens, and for a mixture-of-experts model (GPT-OSS) a
tiny difference can flip a top-k routing decision and change a token's probability a lot. Then the PPO ratio of
the first on-policy mini-batch is not 1, clipping fires where nothing has been updated yet, and training silently
drifts (the GPT-OSS retrospective's symptom). This module measures it:

- `trainer_logprobs(model, sequences)` recomputes the trainer's log-probability of each completion token given
  its prompt ids (a teacher-forced forward pass, right-padded batches of `batch_size`).
- `row_sequences(rows, tokenizer)` takes rollout rows with stored `completion_logprobs` and gives (prompt ids,
  completion ids, rollout logprobs) per assistant turn: the stored `prompt_token_ids` where the row has them,
  else the conversation before the turn re-rendered with the chat template (counted as `rerendered_turns`: a
  re-rendered prompt may differ from what the model saw; training/preflight compares them).
- `panel(trainer, rollout)` gives mean and max |Δlogp|, the Pearson correlation of the two, NeMo-RL's
  `token_mult_prob_error` (the token mean of exp(|Δlogp|); its CI fails a run whose median over steps reaches
  1.1), the importance weights exp(trainer - rollout) (mean, min, max, std), and, with `old` given, the clip
  fraction of the first on-policy mini-batch (`clip_fraction`: share of tokens whose ratio exp(logp - old_logp)
  falls outside [1 - eps, 1 + eps]). With `old_logp = logp.detach()` (TRL's choice when training is exactly
  on-policy, the retrospective's fix #1) the ratio is exactly 1 and the clip fraction 0; with a separate
  old-policy pass it is whatever the two passes disagree by.
- `promotion_refusals(panel, thresholds)` says which configured threshold (training.config.MismatchThresholds) a
  panel crosses; the caller refuses to promote the checkpoint and logs the line. `panel_limits(thresholds)` gives
  the same thresholds per figure, for the rounds table and the report's plot.

Plain functions over lists and tensors; it does not train, generate or decide what to do with a refusal.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, Field

from training.config import MismatchThresholds
from warehouse.record import Trajectory


class MismatchError(ValueError):
    """The panel cannot be computed from these inputs (no stored logprobs, lengths that do not match)."""


class MismatchPanel(BaseModel):
    tokens: int = Field(description="Completion tokens compared.")
    sequences: int = Field(description="Assistant turns compared.")
    mean_abs_diff: float = Field(description="Mean |trainer - rollout| log-probability per token (nats).")
    max_abs_diff: float = Field(description="Largest |trainer - rollout| log-probability of one token (nats).")
    pearson: float | None = Field(description="Pearson correlation of trainer and rollout log-probabilities "
                                  "(None when either is constant).")
    token_mult_prob_error: float = Field(description="NeMo-RL's multiplicative probability error: the token mean "
                                         "of exp(|trainer - rollout|); 1.0 is a perfect match.")
    iw_mean: float = Field(description="Importance weight exp(trainer - rollout), mean over tokens.")
    iw_min: float
    iw_max: float
    iw_std: float
    clip_fraction: float | None = Field(default=None, description="Share of tokens of the first on-policy "
                                        "mini-batch whose PPO ratio exp(logp - old_logp) lies outside "
                                        "[1 - eps, 1 + eps]; must be 0 (None when no old log-probs were given).")
    rerendered_turns: int = Field(default=0, description="Turns whose prompt ids were re-rendered from text, not "
                                  "stored by the policy.")


def panel(trainer: list[list[float]], rollout: list[list[float]], *, old: list[list[float]] | None = None,
          epsilon: float = 0.2, rerendered_turns: int = 0) -> MismatchPanel:
    """The panel over per-sequence token log-probabilities (the same tokens in `trainer`, `rollout` and `old`)."""
    import torch

    if len(trainer) != len(rollout) or any(len(a) != len(b) for a, b in zip(trainer, rollout)):
        raise MismatchError("trainer and rollout log-probabilities must cover the same sequences and tokens")
    t = torch.tensor([x for seq in trainer for x in seq], dtype=torch.float64)
    r = torch.tensor([x for seq in rollout for x in seq], dtype=torch.float64)
    if t.numel() == 0:
        raise MismatchError("no tokens to compare: the rows carry no completion_logprobs")
    d = t - r
    w = torch.exp(d)
    pearson = None
    if t.numel() > 1 and float(t.std()) > 0 and float(r.std()) > 0:
        pearson = float(torch.corrcoef(torch.stack([t, r]))[0, 1])
    clip = None
    if old is not None:
        o = torch.tensor([x for seq in old for x in seq], dtype=torch.float64)
        if o.shape != t.shape:
            raise MismatchError("old log-probabilities must cover the same tokens as the trainer's")
        clip = clip_fraction(t, o, epsilon=epsilon)
    return MismatchPanel(
        tokens=int(t.numel()), sequences=len(trainer), mean_abs_diff=float(d.abs().mean()),
        max_abs_diff=float(d.abs().max()), pearson=pearson, token_mult_prob_error=float(torch.exp(d.abs()).mean()),
        iw_mean=float(w.mean()), iw_min=float(w.min()), iw_max=float(w.max()),
        iw_std=float(w.std()) if w.numel() > 1 else 0.0, clip_fraction=clip, rerendered_turns=rerendered_turns)


def clip_fraction(logp: Any, old_logp: Any, *, epsilon: float = 0.2, epsilon_high: float | None = None) -> float:
    """Share of tokens whose PPO ratio exp(logp - old_logp) lies outside [1 - epsilon, 1 + epsilon_high]."""
    import torch

    ratio = torch.exp(torch.as_tensor(logp, dtype=torch.float64) - torch.as_tensor(old_logp, dtype=torch.float64))
    hi = epsilon if epsilon_high is None else epsilon_high
    if ratio.numel() == 0:
        return 0.0
    return float(((ratio < 1 - epsilon) | (ratio > 1 + hi)).double().mean())


def trainer_logprobs(model: Any, sequences: list[tuple[list[int], list[int]]], *, batch_size: int = 8,
                     pad_token_id: int = 0) -> list[list[float]]:
    """Log-probability of each completion token given its prompt, from one teacher-forced forward pass per batch.

    `sequences` holds (prompt ids, completion ids) pairs; batches are right-padded, so the tokens' positions are
    the ones the rollout used. The model runs as it is (train/eval mode, dtype, device): the caller chooses."""
    import torch

    out: list[list[float]] = []
    device = next(model.parameters()).device
    for i in range(0, len(sequences), batch_size):
        chunk = sequences[i: i + batch_size]
        rows = [p + c for p, c in chunk]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(r)
            attn[j, : len(r)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1)
        for j, (p, c) in enumerate(chunk):
            out.append(lp[j, len(p) - 1: len(p) - 1 + len(c)].cpu().tolist())
    return out


def row_sequences(rows: list[Trajectory], tokenizer: Any) -> tuple[list[tuple[list[int], list[int]]],
                                                                    list[list[float]], int]:
    """(prompt ids, completion ids) per assistant turn with stored logprobs, the rollout's logprobs, and how many
    prompts were re-rendered (no stored prompt_token_ids). MismatchError when no row carries logprobs."""
    from warehouse import chat

    seqs: list[tuple[list[int], list[int]]] = []
    lps: list[list[float]] = []
    rerendered = 0
    for row in rows:
        if not row.completion_token_ids or not row.completion_logprobs:
            continue
        turns = [i for i, m in enumerate(row.messages) if m.role == "assistant"]
        tools = json.loads(row.tools_json or "[]") or None
        for k, (ids, lp) in enumerate(zip(row.completion_token_ids, row.completion_logprobs)):
            if not ids or len(ids) != len(lp) or k >= len(turns):
                continue
            stored = row.prompt_token_ids[k] if row.prompt_token_ids and k < len(row.prompt_token_ids) else None
            if stored:
                prompt = list(stored)
            else:
                msgs = chat.to_template(row.messages[: turns[k]], template=tokenizer.chat_template)
                enc = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=True,
                                                    return_dict=True)
                prompt = list(enc["input_ids"])
                rerendered += 1
            seqs.append((prompt, list(ids)))
            lps.append(list(lp))
    if not seqs:
        raise MismatchError(f"none of {len(rows)} rows carries completion_token_ids with completion_logprobs; the "
                            f"panel needs rollouts from a policy that returns them (in-process transformers, vLLM)")
    return seqs, lps, rerendered


def rows_panel(model: Any, tokenizer: Any, rows: list[Trajectory], *, batch_size: int = 8,
               old_batch_size: int | None = None, epsilon: float = 0.2) -> MismatchPanel:
    """The panel of rollout rows against `model` (the trainer's view of the same tokens).

    With `old_batch_size`, a separate old-policy pass recomputes the same log-probabilities in batches of that size
    (another batch composition, as an old-policy pass over differently packed mini-batches is) and the clip
    fraction compares the two: same weights, so anything but 0 is the trainer disagreeing with itself."""
    seqs, rollout, rerendered = row_sequences(rows, tokenizer)
    pad = tokenizer.pad_token_id or 0
    trainer = trainer_logprobs(model, seqs, batch_size=batch_size, pad_token_id=pad)
    old = trainer_logprobs(model, seqs, batch_size=old_batch_size, pad_token_id=pad) if old_batch_size else None
    return panel(trainer, rollout, old=old, epsilon=epsilon, rerendered_turns=rerendered)


def panel_limits(t: MismatchThresholds) -> dict[str, tuple[str, float]]:
    """The thresholds of promotion_refusals per panel figure, as ("max" or "min", value), for the rounds table
    and the report's plot; a limit that never refuses (min_pearson -1) is left out."""
    out = {"token_mult_prob_error": ("max", t.max_token_mult_prob_error),
           "mean_abs_diff": ("max", t.max_mean_abs_logp_diff), "clip_fraction": ("max", t.max_clip_fraction)}
    if t.min_pearson > -1:
        out["pearson"] = ("min", t.min_pearson)
    return out


def promotion_refusals(p: MismatchPanel, t: MismatchThresholds) -> list[str]:
    """Which thresholds the panel crosses, one line each naming the figure, its value and the limit (empty: the
    checkpoint may be promoted)."""
    out: list[str] = []
    if p.token_mult_prob_error >= t.max_token_mult_prob_error:
        out.append(f"token_mult_prob_error {p.token_mult_prob_error:.4f} >= {t.max_token_mult_prob_error} "
                   f"(mismatch.max_token_mult_prob_error)")
    if p.mean_abs_diff > t.max_mean_abs_logp_diff:
        out.append(f"mean |Δlogp| {p.mean_abs_diff:.4f} > {t.max_mean_abs_logp_diff} "
                   f"(mismatch.max_mean_abs_logp_diff)")
    if p.pearson is not None and p.pearson < t.min_pearson:
        out.append(f"Pearson correlation {p.pearson:.4f} < {t.min_pearson} (mismatch.min_pearson)")
    if p.clip_fraction is not None and p.clip_fraction > t.max_clip_fraction:
        out.append(f"first on-policy mini-batch clip fraction {p.clip_fraction:.4f} > {t.max_clip_fraction} "
                   f"(mismatch.max_clip_fraction): the trainer disagrees with itself (MoE routing flips)")
    if not math.isfinite(p.mean_abs_diff):
        out.append("log-probabilities are not finite")
    return out
