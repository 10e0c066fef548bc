"""The GPT-OSS retrospective's bug reproduced offline: a trainer without attention sinks against rollouts with them.

Steps, all real: a tiny GPT-OSS student (MoE top-k routing, attention sinks, sliding window; TRL's gptoss template)
built from arithmetic-d1 and given a short SFT on the reference teacher's episodes (real sandboxes); rollouts of
`--tasks` tasks x `--group` samples from the in-process policy (transformers' own sink-aware attention, batched
`generate` with a KV cache, logprobs stored per token), once in fp32 and once in bf16 (what a serving engine runs).
Then, per condition, the trainer (fp32) recomputes the log-probabilities of the same tokens with its attention
kernel (training/attention.py):

  - matched:                  fp32 rollouts, trainer `eager` (the same computation);
  - bf16 rollouts:            bf16 rollouts, trainer `eager` (an engine's precision, sinks on both sides);
  - trainer without sinks:    bf16 rollouts, trainer `sdpa_nosinks` (a stand-in for FlashAttention-2: the seed's bug);
  - without sinks + fix:      bf16 rollouts, trainer `sdpa_sinks` (a sink-aware kernel: the seed's fix);
  - and the last two again on fp32 rollouts, to separate the sinks from the precision.

For each: the mismatch panel (mean and max |Δlogp|, token_mult_prob_error, importance weights exp(trainer -
rollout)), the clip fraction of GRPO's first mini-batch when the rollout's logprobs are old_logp (the ratio is the
importance weight; outside [1 - eps, 1 + eps] is clipped), whether the default promotion thresholds refuse it, and
GRPO's gradient norm: the L2 norm (before clipping) of the gradient of GRPO's clipped objective over these
episodes (token mean; advantages = group-normalised rewards, 1 for a passing episode, 0 otherwise; old_logp = the
rollout's logprobs, the engine-side behaviour policy). Prints a table and writes JSON.

    .venv/bin/python benchmarks/attention_sinks.py --out benchmarks/attention_sinks.json

GRPO's gradient needs groups whose episodes both pass and fail: the short SFT of a fresh student rarely passes,
so its norms are ~0. `--student DIR` rolls out a trained tiny-gptoss instead (a flywheel round's checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.mismatch_gptoss import sft_student, student_args

CONDITIONS = (  # name, rollout dtype, trainer kernel
    ("matched", "float32", "eager"),
    ("bf16 rollouts", "bfloat16", "eager"),
    ("trainer without sinks", "bfloat16", "sdpa_nosinks"),
    ("without sinks + fix", "bfloat16", "sdpa_sinks"),
    ("fp32, trainer without sinks", "float32", "sdpa_nosinks"),
    ("fp32, without sinks + fix", "float32", "sdpa_sinks"),
)


def episode_turns(rows: list, tokenizer: Any) -> tuple[list, list, list[float]]:
    """(prompt ids, completion ids) per assistant turn, the rollout's logprobs, and the group-normalised advantage
    of the episode each turn belongs to (groups: the samples of one task)."""
    from training.mismatch import MismatchError, row_sequences

    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r.task_id, []).append(1.0 if r.verdict == "pass" else 0.0)
    seqs: list = []
    lps: list = []
    adv: list[float] = []
    for r in rows:
        try:
            s, lp, _ = row_sequences([r], tokenizer)
        except MismatchError:
            continue
        g = groups[r.task_id]
        mean = sum(g) / len(g)
        std = (sum((x - mean) ** 2 for x in g) / max(1, len(g) - 1)) ** 0.5
        a = ((1.0 if r.verdict == "pass" else 0.0) - mean) / (std + 1e-4)
        seqs += s
        lps += lp
        adv += [a] * len(s)
    return seqs, lps, adv


def grpo_grad_norm(model: Any, seqs: list, old: list[list[float]], adv: list[float], *, epsilon: float,
                   pad: int, batch_size: int = 8) -> float:
    """L2 norm of the gradient of GRPO's clipped objective (token mean) with `old` as old_logp, before clipping."""
    import torch

    model.zero_grad(set_to_none=True)
    total = sum(len(c) for _, c in seqs)
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i: i + batch_size]
        width = max(len(p) + len(c) for p, c in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for j, (p, c) in enumerate(chunk):
            ids[j, : len(p) + len(c)] = torch.tensor(p + c)
            att[j, : len(p) + len(c)] = 1
        logits = model(input_ids=ids, attention_mask=att).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        loss = torch.zeros(())
        for j, (p, c) in enumerate(chunk):
            logp = lp[j, len(p) - 1: len(p) - 1 + len(c)]
            ratio = torch.exp(logp - torch.tensor(old[i + j]))
            a = adv[i + j]
            loss = loss - torch.minimum(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a).sum()
        (loss / total).backward()
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/flywheel-attention-sinks.json")
    ap.add_argument("--work", default="/tmp/flywheel-attention-sinks")
    ap.add_argument("--tasks", type=int, default=8, help="tasks rolled out per dtype")
    ap.add_argument("--group", type=int, default=4, help="samples per task (GRPO's group)")
    ap.add_argument("--student", default=None, help="a trained tiny-gptoss model folder to roll out (e.g. a "
                    "flywheel round's checkpoint, models/RUN-r1-grpo under the run's out); default: a short SFT "
                    "of a fresh one (--sft-steps), whose episodes rarely pass, so GRPO's gradient is ~0")
    student_args(ap)
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from training.attention import use_attention
    from training.config import MismatchThresholds
    from training.mismatch import panel, promotion_refusals, trainer_logprobs
    from training.tiny import n_parameters

    t0 = time.perf_counter()
    rollouts: dict[str, tuple] = {}
    with open_backend(SandboxConfig(backend=args.backend, timeout_s=10.0), pool_size=4) as backend:
        if args.student:  # a trained tiny-gptoss (a flywheel round's checkpoint): its rollouts pass and fail
            from tasks import arithmetic

            train, student = arithmetic.generate(64, split="train", seed=3, difficulty=1), args.student
            trained = f"the trained student {student}"
        else:
            train, _, sft = sft_student(Path(args.work), backend, hidden=args.hidden, layers=args.layers,
                                        experts=args.experts, top_k=args.top_k, sft_steps=args.sft_steps)
            student, trained = sft.checkpoint_path, f"SFT {sft.steps} steps (loss {sft.losses[-1]:.3f})"
        for dtype in ("float32", "bfloat16"):
            policy = TransformersPolicy(student, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                        seed=7, batch_size=16, dtype=dtype, name=f"student-{dtype}")
            out: list = []
            asyncio.run(rollout(train[: args.tasks], policy, backend, run_id=f"sinks-{dtype}", samples=args.group,
                                concurrency=16, on_rows=out.extend, batch_size=args.tasks * args.group,
                                progress=False))
            rollouts[dtype] = (out, *episode_turns(out, policy.tokenizer))
            tokenizer = policy.tokenizer
    pad = tokenizer.pad_token_id or 0
    limits = MismatchThresholds()
    results = []
    for name, dtype, kernel in CONDITIONS:
        rows, seqs, rollout_lp, adv = rollouts[dtype]
        model = use_attention(AutoModelForCausalLM.from_pretrained(student), kernel).eval()
        logp = trainer_logprobs(model, seqs, batch_size=8, pad_token_id=pad)
        p = panel(logp, rollout_lp, old=rollout_lp, epsilon=args.epsilon)
        norm = grpo_grad_norm(model, seqs, rollout_lp, adv, epsilon=args.epsilon, pad=pad)
        results.append({"condition": name, "rollout_dtype": dtype, "trainer_attention": kernel,
                        "episodes": len(rows), "passed": sum(r.verdict == "pass" for r in rows),
                        **p.model_dump(), "grpo_grad_norm": norm,
                        "refused": promotion_refusals(p, limits)})
    passed = ", ".join(f"{d}: {sum(r.verdict == 'pass' for r in v[0])} of {len(v[0])} passed"
                       for d, v in rollouts.items())
    conf = AutoConfig.from_pretrained(student)
    print(f"\ntiny-gptoss: {n_parameters(student):,} parameters, {conf.num_local_experts} experts "
          f"top-{conf.num_experts_per_tok}; {trained}; {args.tasks} tasks x {args.group} samples per rollout "
          f"dtype ({passed})")
    head = ("condition", "rollout", "trainer", "tokens", "mean|Δ|", "max|Δ|", "tmpe", "iw_min", "iw_max", "clip",
            "grad_norm", "promotion")
    widths = (28, 9, 13, 7, 9, 9, 9, 8, 8, 7, 10, 9)
    print("  ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for r in results:
        cells = (r["condition"], r["rollout_dtype"][:9], r["trainer_attention"], r["tokens"],
                 f"{r['mean_abs_diff']:.2e}", f"{r['max_abs_diff']:.2e}", f"{r['token_mult_prob_error']:.5f}",
                 f"{r['iw_min']:.4f}", f"{r['iw_max']:.4f}", f"{r['clip_fraction']:.4f}", f"{r['grpo_grad_norm']:.4g}",
                 "refused" if r["refused"] else "promoted")
        print("  ".join(f"{c!s:>{w}}" for c, w in zip(cells, widths)))
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f}s")
    Path(args.out).write_text(json.dumps({"args": vars(args), "thresholds": limits.model_dump(),
                                          "results": results, "wall_s": wall}, indent=1))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
