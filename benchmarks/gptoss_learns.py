"""What holds the tiny GPT-OSS student back: SFT variants side by side on the same episodes, scored held-out.

Steps, all real: the offline default's arithmetic-d1 train tasks (the flywheel's corpus and seed), the reference
teacher's passing episodes on `--tasks` of them (real sandboxes), then per variant a tiny base of the default size
(student.tiny) built from that corpus, its 400-step copy warm-up, an SFT of `--steps` steps with the flywheel's
SFT recipe (batch 8, cosine, weight decay 0.3) at the variant's learning rate, and greedy pass@1 on the default's
50 held-out arithmetic-d1 tasks. Variants (`--variants`, comma-separated):

  - tiny:               the default Qwen2-style dense student at 5e-3 (the baseline);
  - gptoss:             tiny-gptoss (4 experts, top-2 routing, aux loss 0.9 as GPT-OSS ships) at 5e-3;
  - gptoss-aux0:        the same without the load-balancing loss (router_aux_loss_coef 0);
  - gptoss-1expert:     one expert, top-1 (no routing choice: a dense MLP with GPT-OSS's attention);
  - gptoss-lr1e-3:      4 experts, top-2, at 1e-3 (training.config.TINY_SFT_LEARNING_RATES).

Prints a table (loss at steps 100/400/end, token accuracy at the end, held-out pass@1, SFT wall) and writes JSON.

    .venv/bin/python benchmarks/gptoss_learns.py --out /tmp/gptoss-learns.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# name -> (family, learning rate, experts, experts per token, router_aux_loss_coef or None for the family's)
VARIANTS: dict[str, tuple[str, float, int, int, float | None]] = {
    "tiny": ("tiny", 5e-3, 4, 2, None),
    "gptoss": ("tiny-gptoss", 5e-3, 4, 2, None),
    "gptoss-aux0": ("tiny-gptoss", 5e-3, 4, 2, 0.0),
    "gptoss-1expert": ("tiny-gptoss", 5e-3, 1, 1, None),
    "gptoss-lr1e-3": ("tiny-gptoss", 1e-3, 4, 2, None),
}


def base_student(work: Path, name: str, train: list, *, aux: float | None, experts: int, top_k: int,
                 family: str) -> Path:
    """The default-size tiny base of `family` built from `train`'s corpus, with its copy warm-up (as round 0)."""
    from transformers import AutoConfig

    from flows.config import FlywheelConfig
    from training.tiny import build_tiny_model, task_corpus
    from training.warmup import warm_up_copying

    t = FlywheelConfig().student.tiny
    path = work / name / "base"
    shutil.rmtree(path, ignore_errors=True)
    build_tiny_model(path, task_corpus(train, family=family), family=family, hidden=t.hidden, layers=t.layers,
                     heads=t.heads, kv_heads=t.kv_heads, vocab_size=t.vocab_size, seed=t.seed, experts=experts,
                     experts_per_token=top_k)
    if aux is not None:  # TRL's trainers read the coefficient from the model's config
        conf = AutoConfig.from_pretrained(path)
        conf.router_aux_loss_coef = aux
        conf.save_pretrained(path)
    warm_up_copying(path, [task.prompt for task in train], steps=t.copy_warmup_steps,
                    learning_rate=t.copy_warmup_learning_rate, seed=t.seed, threads=1)
    return path


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/flywheel-gptoss-learns.json")
    ap.add_argument("--work", default="/tmp/flywheel-gptoss-learns")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=800, help="SFT steps per variant")
    ap.add_argument("--tasks", type=int, default=2000, help="train tasks the reference teacher plays once each")
    ap.add_argument("--heldout", type=int, default=50, help="held-out arithmetic-d1 tasks scored greedily")
    ap.add_argument("--backend", default="local", choices=["local", "docker"], help="sandbox backend")
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [n for n in names if n not in VARIANTS]:
        ap.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")

    import torch

    torch.set_num_threads(1)
    from agents.reference import ReferencePolicy
    from agents.rollout import rollout
    from flows.config import FlywheelConfig
    from flows.rollouts import heldout_tasks, schedule_train_tasks
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from training.scoring import run_in_memory, score_checkpoint
    from training.sft import train_sft

    cfg = FlywheelConfig()
    corpus = schedule_train_tasks(cfg)
    train = [t for t in corpus if t.suite == "arithmetic" and t.difficulty == 1][: args.tasks]
    held = [t for t in heldout_tasks(cfg) if t.suite == "arithmetic" and t.difficulty == 1][: args.heldout]
    work = Path(args.work)
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    with open_backend(SandboxConfig(backend=args.backend, timeout_s=10.0), pool_size=2) as backend:
        rows: list = []
        asyncio.run(rollout(train, ReferencePolicy(), backend, run_id="gl-ref", concurrency=4, on_rows=rows.extend,
                            batch_size=64, progress=False))
        passing = [r for r in rows if r.verdict == "pass"]
        print(f"reference teacher: {len(passing)} passing episodes of {len(rows)}", flush=True)
        run = run_in_memory(backend, cfg.rollout, run_id="gl-score", round=1)
        for name in names:
            family, lr, experts, top_k, aux = VARIANTS[name]
            base = base_student(work, name, corpus, aux=aux, experts=experts, top_k=top_k, family=family)
            sft = train_sft(base, passing, work / name / "sft",
                            cfg.sft.model_copy(update={"max_steps": args.steps, "learning_rate": lr}), progress=False)
            scored = score_checkpoint(sft.checkpoint_path, held, student=cfg.student, run=run, name=name,
                                      sampling=None)
            score = next(s.value for s in scored.greedy.scores if s.suite == "arithmetic-d1")
            losses = sft.losses
            results.append({"variant": name, "family": family, "learning_rate": lr, "experts": experts,
                            "experts_per_token": top_k, "router_aux_loss_coef": aux,
                            "loss_100": mean(losses[90:100]), "loss_400": mean(losses[390:400]),
                            "loss_end": mean(losses[-10:]), "heldout_pass1": score, "sft_wall_s": sft.wall_s,
                            "steps": sft.steps})
            print(f"{name}: loss end {results[-1]['loss_end']:.3f}, held-out {score:.2f}", flush=True)
    head = ("variant", "lr", "experts", "aux", "loss@100", "loss@400", "loss end", "held-out", "SFT s")
    print("  ".join(f"{h:>15}" if i == 0 else f"{h:>9}" for i, h in enumerate(head)))
    for r in results:
        moe = f"{r['experts']}/top{r['experts_per_token']}" if r["family"] == "tiny-gptoss" else "dense"
        cells = [r["variant"], f"{r['learning_rate']:g}", moe,
                 "-" if r["router_aux_loss_coef"] is None else f"{r['router_aux_loss_coef']:g}",
                 f"{r['loss_100']:.3f}", f"{r['loss_400']:.3f}", f"{r['loss_end']:.3f}", f"{r['heldout_pass1']:.2f}",
                 f"{r['sft_wall_s']:.0f}"]
        print("  ".join(f"{c:>15}" if i == 0 else f"{c:>9}" for i, c in enumerate(cells)))
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f}s")
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "wall_s": wall}, indent=1))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
