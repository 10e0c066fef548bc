"""The mismatch panel on tiny-gptoss, with and without the on-policy fix `old_logp = logp.detach()`, in one run.

Steps, all real: a tiny GPT-OSS student (MoE with top-k routing, attention sinks, sliding window; TRL's gptoss
template) built from the arithmetic corpus and given a short SFT on reference-teacher episodes (real loop, real
sandboxes); rollouts from the in-process policy (batched `generate` with a KV cache, logprobs stored per token),
once in fp32 and once in bf16; the trainer's log-probabilities of the same tokens recomputed in fp32
(training/mismatch.py). For each rollout dtype the panel (|Δlogp|, Pearson, token_mult_prob_error, importance
weights) and the clip fraction of the first on-policy mini-batch under three choices of old_logp:
  - `detach`: old_logp = logp.detach() (TRL's choice when exactly on-policy; the retrospective's fix #1): ratio 1;
  - `separate pass`: a second no-grad forward pass, other batch composition (batch 1 instead of 8), fp32;
  - `separate pass bf16`: the same second pass in bf16 (an old-policy pass on other kernels/precision);
  - `rollout logprobs`: the logprobs the rollout stored (what an engine-side old_logp gives).
Also the share of (token, layer) routing decisions whose top-k expert set differs between the fp32 and the bf16
forward pass (the MoE symptom: a small numeric difference flips experts). Prints a table and writes JSON.

    .venv/bin/python benchmarks/mismatch_gptoss.py --out /tmp/mismatch-gptoss.json
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


def _routing_flips(model_dir: str, seqs: list[tuple[list[int], list[int]]]) -> float:
    """Share of (token, layer) top-k expert sets that differ between an fp32 and a bf16 forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    sets = {}
    for dtype in (torch.float32, torch.bfloat16):
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        k = m.config.num_experts_per_tok
        out = []
        for p, c in seqs:
            with torch.no_grad():
                logits = m(input_ids=torch.tensor([p + c]), output_router_logits=True).router_logits
            out.append([torch.topk(layer.float(), k, dim=-1).indices.sort(dim=-1).values for layer in logits])
        sets[dtype] = out
    same = total = 0
    for a_seq, b_seq in zip(sets[torch.float32], sets[torch.bfloat16]):
        for a, b in zip(a_seq, b_seq):
            eq = (a == b).all(dim=-1)
            same += int(eq.sum())
            total += eq.numel()
    return 1 - same / total if total else 0.0


def sft_student(work: Path, backend: Any, *, hidden: int, layers: int, experts: int, top_k: int,
                sft_steps: int, attention: str = "eager") -> tuple[list, Path, Any]:
    """64 arithmetic-d1 train tasks, a tiny-gptoss base built from them, and its SFT on the reference teacher's
    passing episodes (real sandboxes of `backend`), the trainer running attention kernel `attention`."""
    from agents.reference import ReferencePolicy
    from agents.rollout import rollout
    from tasks import arithmetic
    from training.config import SFTConfig
    from training.sft import train_sft
    from training.tiny import build_tiny_model, task_corpus

    train = arithmetic.generate(64, split="train", seed=3, difficulty=1)
    base = build_tiny_model(work / "base", task_corpus(train, family="tiny-gptoss"), family="tiny-gptoss",
                            hidden=hidden, layers=layers, heads=4, kv_heads=2, vocab_size=1024, experts=experts,
                            experts_per_token=top_k)
    rows: list = []
    asyncio.run(rollout(train, ReferencePolicy(), backend, run_id="mm-ref", concurrency=4, on_rows=rows.extend,
                        batch_size=len(train), progress=False))
    sft = train_sft(base, [r for r in rows if r.verdict == "pass"], work / "sft",
                    SFTConfig(max_steps=sft_steps, batch_size=8, learning_rate=5e-3), progress=False,
                    attention=attention)
    return train, base, sft


def student_args(ap: argparse.ArgumentParser) -> None:
    """The options of `sft_student` and of the student's rollouts, shared by the GPT-OSS benchmarks."""
    ap.add_argument("--backend", default="local", choices=["local", "docker"], help="sandbox backend")
    ap.add_argument("--sft-steps", type=int, default=60, help="SFT steps on the reference teacher's episodes")
    ap.add_argument("--hidden", type=int, default=64, help="tiny-gptoss hidden size")
    ap.add_argument("--layers", type=int, default=2, help="tiny-gptoss layers")
    ap.add_argument("--experts", type=int, default=8, help="MoE experts per layer")
    ap.add_argument("--top-k", type=int, default=2, help="experts per token")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens per student turn")
    ap.add_argument("--epsilon", type=float, default=0.2, help="GRPO's clip range of the importance weight")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/flywheel-mismatch-gptoss.json")
    ap.add_argument("--work", default="/tmp/flywheel-mismatch-gptoss")
    ap.add_argument("--tasks", type=int, default=16, help="rollout episodes per dtype")
    student_args(ap)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from training.mismatch import panel, row_sequences, trainer_logprobs
    from training.tiny import n_parameters

    t0 = time.perf_counter()
    with open_backend(SandboxConfig(backend=args.backend, timeout_s=10.0), pool_size=4) as backend:
        train, base, sft = sft_student(Path(args.work), backend, hidden=args.hidden, layers=args.layers,
                                       experts=args.experts, top_k=args.top_k, sft_steps=args.sft_steps)
        results = []
        for dtype in ("float32", "bfloat16"):
            policy = TransformersPolicy(sft.checkpoint_path, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                        seed=7, batch_size=8, dtype=dtype, name=f"student-{dtype}")
            out: list = []
            asyncio.run(rollout(train[: args.tasks], policy, backend, run_id=f"mm-{dtype}", concurrency=8,
                                on_rows=out.extend, batch_size=args.tasks, progress=False))
            seqs, rollout_lp, _ = row_sequences(out, policy.tokenizer)
            pad = policy.tokenizer.pad_token_id or 0
            fp32 = AutoModelForCausalLM.from_pretrained(sft.checkpoint_path).eval()
            bf16 = AutoModelForCausalLM.from_pretrained(sft.checkpoint_path, dtype=torch.bfloat16).eval()
            logp = trainer_logprobs(fp32, seqs, batch_size=8, pad_token_id=pad)
            olds = {"detach (fix)": logp,
                    "separate pass": trainer_logprobs(fp32, seqs, batch_size=1, pad_token_id=pad),
                    "separate pass bf16": trainer_logprobs(bf16, seqs, batch_size=1, pad_token_id=pad),
                    "rollout logprobs": rollout_lp}
            for old_name, old in olds.items():
                p = panel(logp, rollout_lp, old=old, epsilon=args.epsilon)
                results.append({"rollout_dtype": dtype, "old_logp": old_name, **p.model_dump()})
            results[-1]["routing_flips_fp32_vs_bf16"] = _routing_flips(sft.checkpoint_path, seqs)
    print(f"\ntiny-gptoss: {n_parameters(base):,} parameters, {args.experts} experts top-{args.top_k}, "
          f"SFT {sft.steps} steps (loss {sft.losses[-1]:.3f}); {args.tasks} episodes per rollout dtype")
    head = ("rollout", "old_logp", "tokens", "mean|Δ|", "max|Δ|", "pearson", "tmpe", "iw_min", "iw_max", "clip")
    print("  ".join(f"{h:>18}" if i == 1 else f"{h:>9}" for i, h in enumerate(head)))
    for r in results:
        cells = [r["rollout_dtype"][:9], r["old_logp"], r["tokens"], f"{r['mean_abs_diff']:.2e}",
                 f"{r['max_abs_diff']:.2e}", f"{r['pearson']:.5f}" if r["pearson"] is not None else "-",
                 f"{r['token_mult_prob_error']:.5f}", f"{r['iw_min']:.4f}", f"{r['iw_max']:.4f}",
                 f"{r['clip_fraction']:.4f}"]
        print("  ".join(f"{c:>18}" if i == 1 else f"{c!s:>9}" for i, c in enumerate(cells)))
    flips = [r for r in results if "routing_flips_fp32_vs_bf16" in r]
    for r in flips:
        print(f"routing flips fp32 vs bf16 forward ({r['rollout_dtype']} rollout tokens): "
              f"{r['routing_flips_fp32_vs_bf16']:.2%} of (token, layer) top-{args.top_k} expert sets")
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f}s")
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "wall_s": wall}, indent=1))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
