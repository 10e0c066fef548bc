"""Offline training demo on the arithmetic suite, measured: fresh tiny student vs SFT student vs GRPO student.

Steps, all real: reference-teacher episodes through the episode loop in sandboxes (local bubblewrap backend, or
--backend docker); a tiny model built from the task corpus; the base scored on the held-out split (baseline, same
process); SFT on the teacher's passing episodes; the SFT student scored; optionally GRPO from the SFT student on a
train suite and scored again. Prints a table (held-out pass rate, mean reward, wall and CPU seconds per stage) and
writes JSON to --out.

    .venv/bin/python benchmarks/train_arithmetic.py --out /tmp/train-arith.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path


def _timed(fn, *a, **kw):
    t, c = time.perf_counter(), time.process_time()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/flywheel-train-arithmetic.json")
    ap.add_argument("--work", default="/tmp/flywheel-train-arithmetic")
    ap.add_argument("--backend", default="local", choices=["local", "docker"])
    ap.add_argument("--train-tasks", type=int, default=4000)
    ap.add_argument("--heldout-tasks", type=int, default=100)
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--sft-steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--grpo-steps", type=int, default=0, help="0 skips GRPO")
    ap.add_argument("--grpo-difficulty", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from agents.reference import ReferencePolicy
    from agents.rollout import rollout
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks import arithmetic
    from training.config import GRPOConfig, SFTConfig
    from training.evaluate import evaluate
    from training.grpo import train_grpo
    from training.sft import train_sft
    from training.tiny import build_tiny_model, n_parameters, task_corpus

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    backend = open_backend(SandboxConfig(backend=args.backend))
    table: list[dict] = []
    try:
        train = arithmetic.generate(args.train_tasks, split="train", seed=args.seed, difficulty=args.difficulty)
        held = arithmetic.generate(args.heldout_tasks, split="heldout", seed=args.seed, difficulty=args.difficulty)
        rows: list = []
        _, w, c = _timed(lambda: asyncio.run(rollout(train, ReferencePolicy(), backend, run_id="bench", concurrency=8,
                                                     on_rows=rows.extend, batch_size=len(train), progress=False)))
        teacher = [r for r in rows if r.verdict == "pass"]
        table.append({"stage": "teacher rollouts", "episodes": len(rows), "passes": len(teacher), "wall_s": w,
                      "cpu_s": c})
        base, w, c = _timed(build_tiny_model, work / "base", task_corpus(train), hidden=args.hidden,
                            layers=args.layers, heads=4, kv_heads=2, seed=args.seed)
        table.append({"stage": "build tiny", "params": n_parameters(base), "wall_s": w, "cpu_s": c})
        ev, w, c = _timed(evaluate, base, held, backend)
        table.append({"stage": "base heldout", "pass_rate": ev.pass_rate, "mean_reward": ev.mean_reward,
                      "verdicts": ev.verdicts, "wall_s": w, "cpu_s": c})
        cfg = SFTConfig(max_steps=args.sft_steps, learning_rate=args.lr, batch_size=args.batch, seed=args.seed)
        sft, w, c = _timed(train_sft, base, teacher, work / "sft", cfg, progress=False)
        table.append({"stage": "sft", "steps": sft.steps, "examples": sft.n_examples,
                      "dropped": sft.n_dropped_truncated + sft.n_dropped_malformed, "final_loss": sft.losses[-1],
                      "wall_s": w, "cpu_s": c})
        ev, w, c = _timed(evaluate, sft.checkpoint_path, held, backend)
        table.append({"stage": "sft heldout", "pass_rate": ev.pass_rate, "mean_reward": ev.mean_reward,
                      "verdicts": ev.verdicts, "wall_s": w, "cpu_s": c})
        if args.grpo_steps:
            gtrain = arithmetic.generate(200, split="train", seed=args.seed + 1, difficulty=args.grpo_difficulty)
            gheld = arithmetic.generate(args.heldout_tasks, split="heldout", seed=args.seed,
                                        difficulty=args.grpo_difficulty)
            if args.grpo_difficulty != args.difficulty:
                ev, w, c = _timed(evaluate, sft.checkpoint_path, gheld, backend)
                table.append({"stage": f"sft heldout d{args.grpo_difficulty}", "pass_rate": ev.pass_rate,
                              "mean_reward": ev.mean_reward, "verdicts": ev.verdicts, "wall_s": w, "cpu_s": c})
            gcfg = GRPOConfig(max_steps=args.grpo_steps, num_generations=8, prompts_per_step=4,
                              learning_rate=2e-4, max_completion_length=64, max_tool_calling_iterations=1,
                              seed=args.seed)
            g, w, c = _timed(train_grpo, sft.checkpoint_path, gtrain, work / "grpo", gcfg, backend=backend,
                             progress=False)
            table.append({"stage": "grpo", "steps": g.steps, "episodes": g.episodes, "verdicts": g.verdicts,
                          "hacks_with_positive_reward": g.hacks_with_positive_reward,
                          "reward_first": g.rewards[0] if g.rewards else None,
                          "reward_last": g.rewards[-1] if g.rewards else None, "wall_s": w, "cpu_s": c})
            ev, w, c = _timed(evaluate, g.checkpoint_path, gheld, backend)
            table.append({"stage": f"grpo heldout d{args.grpo_difficulty}", "pass_rate": ev.pass_rate,
                          "mean_reward": ev.mean_reward, "verdicts": ev.verdicts, "wall_s": w, "cpu_s": c})
    finally:
        backend.shutdown()
    print(f"{'stage':<22} {'pass':>6} {'reward':>7} {'wall_s':>8} {'cpu_s':>7}  other")
    for r in table:
        other = {k: v for k, v in r.items() if k not in ("stage", "pass_rate", "mean_reward", "wall_s", "cpu_s")}
        pr = f"{r['pass_rate']:.0%}" if "pass_rate" in r else ""
        mr = f"{r['mean_reward']:.3f}" if "mean_reward" in r else ""
        print(f"{r['stage']:<22} {pr:>6} {mr:>7} {r['wall_s']:>8.1f} {r['cpu_s']:>7.1f}  {json.dumps(other)}")
    base_r = next((r for r in table if r["stage"] == "base heldout"), None)
    sft_r = next((r for r in table if r["stage"] == "sft heldout"), None)
    if base_r and sft_r:
        print(f"held-out pass: base {base_r['pass_rate']:.0%} -> SFT {sft_r['pass_rate']:.0%}")
    Path(args.out).write_text(json.dumps({"args": vars(args), "table": table}, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
