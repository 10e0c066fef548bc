"""Offline training demo on the arithmetic suite, measured: fresh tiny student vs SFT student vs GRPO student.

Steps, all real: reference-teacher episodes through the episode loop in sandboxes (local bubblewrap backend, or
--backend docker); a tiny model built from the task corpus and given its copy warm-up (echoes of the
train prompts, training/warmup.py); the base scored on the held-out split (baseline, same
process); SFT on the teacher's passing episodes; the SFT student scored; optionally GRPO from the SFT student on a
train suite and scored again. Prints a table (held-out pass rate, mean reward, wall and CPU seconds per stage) and
writes JSON to --out. With --eval-samples k every score also samples k episodes per task at --eval-temperature
(seeded per request, so both checkpoints meet the same draws), a finer measure of mean reward than greedy pass@1.

    .venv/bin/python benchmarks/train_arithmetic.py --out /tmp/train-arith.json
    # GRPO from an existing SFT checkpoint (e.g. a flywheel round-1 student) on the harder suite:
    .venv/bin/python benchmarks/train_arithmetic.py --sft-checkpoint DIR --grpo-steps 20 --grpo-difficulty 2 \
        --eval-samples 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and benchmarks/sandbox.py would shadow the package.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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
    ap.add_argument("--copy-warmup-steps", type=int, default=400, help="echo steps on the train prompts before SFT "
                    "(training/warmup.py); 0 starts SFT from the random weights")
    ap.add_argument("--sft-steps", type=int, default=2000)
    ap.add_argument("--sft-no-tool-share", type=float, default=0.0,
                    help="replace this share of the SFT demonstrations (seeded) by ones that answer at once without "
                         "the tool, as a human writing from memory would: SFT then leaves a policy choice that "
                         "GRPO's reward can correct (answers without the tool score as hacks)")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--weight-decay", type=float, default=0.3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--grpo-steps", type=int, default=0, help="0 skips GRPO")
    ap.add_argument("--grpo-difficulty", type=int, default=1)
    ap.add_argument("--grpo-lr", type=float, default=1e-4)
    ap.add_argument("--grpo-generations", type=int, default=8, help="group size")
    ap.add_argument("--grpo-prompts", type=int, default=4, help="tasks per GRPO step")
    ap.add_argument("--grpo-train-tasks", type=int, default=200)
    ap.add_argument("--score-grpo-train", action="store_true",
                    help="also score the GRPO train tasks before and after GRPO (the reward GRPO maximises)")
    ap.add_argument("--grpo-beta", type=float, default=0.0)
    ap.add_argument("--grpo-temperature", type=float, default=1.0, help="sampling temperature of GRPO rollouts")
    ap.add_argument("--grpo-max-completion", type=int, default=128,
                    help="token budget of a GRPO episode's turns and tool results (too small truncates correct ones)")
    ap.add_argument("--eval-samples", type=int, default=0,
                    help="also score k sampled episodes per held-out task at --eval-temperature (mean reward over "
                         "k x tasks: the flywheel's sampled pass@1)")
    ap.add_argument("--eval-temperature", type=float, default=1.0,
                    help="temperature of the sampled score (the flywheel samples at flywheel.sample_temperature)")
    ap.add_argument("--sft-checkpoint", default=None,
                    help="start from this SFT checkpoint: skip the teacher rollouts, the base and SFT")
    ap.add_argument("--sft-base", default=None,
                    help="continue SFT from this checkpoint (e.g. a flywheel round-1 student) instead of a fresh tiny "
                         "base with its copy warm-up: the teacher rollouts and SFT still run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from agents.config import RolloutConfig
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks import arithmetic
    from training.config import GRPOConfig, StudentConfig
    from training.grpo import train_grpo
    from training.scoring import Sampling, run_in_memory, score_checkpoint

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    table: list[dict] = []
    with open_backend(SandboxConfig(backend=args.backend)) as backend:
        held = arithmetic.generate(args.heldout_tasks, split="heldout", seed=args.seed, difficulty=args.difficulty)

        run = run_in_memory(backend, RolloutConfig(), run_id="eval", round=0)
        sampling = (Sampling(k=args.eval_samples, temperature=args.eval_temperature, seed=args.seed)
                    if args.eval_samples else None)

        def score(stage: str, model: str, tasks: list) -> None:
            """Scored as the flywheel scores a checkpoint (training.scoring), with the config's defaults."""
            res = score_checkpoint(model, tasks, student=StudentConfig(), run=run, name="eval", sampling=sampling)
            for suffix, ev in (("", res.greedy), (f" T={args.eval_temperature:g} x{args.eval_samples}", res.sampled)):
                if ev is not None:
                    table.append({"stage": stage + suffix, "pass_rate": ev.pass_rate, "mean_reward": ev.mean_reward,
                                  "verdicts": ev.verdicts, "wall_s": ev.wall_s, "cpu_s": ev.cpu_s})

        sft_path = args.sft_checkpoint
        if sft_path is None:
            sft_path = _teacher_and_sft(args, held, backend, table, score)
        else:
            score("sft heldout", sft_path, held)
        if args.grpo_steps:
            gtrain = arithmetic.generate(args.grpo_train_tasks, split="train", seed=args.seed + 1,
                                         difficulty=args.grpo_difficulty)
            gheld = arithmetic.generate(args.heldout_tasks, split="heldout", seed=args.seed,
                                        difficulty=args.grpo_difficulty)
            if args.grpo_difficulty != args.difficulty:
                score(f"sft heldout d{args.grpo_difficulty}", sft_path, gheld)
            if args.score_grpo_train:
                score("sft grpo-train tasks", sft_path, gtrain)
            gcfg = GRPOConfig(max_steps=args.grpo_steps, num_generations=args.grpo_generations,
                              prompts_per_step=args.grpo_prompts, learning_rate=args.grpo_lr, beta=args.grpo_beta,
                              max_completion_length=args.grpo_max_completion, max_tool_calling_iterations=1,
                              temperature=args.grpo_temperature, seed=args.seed)
            g, w, c = _timed(train_grpo, sft_path, gtrain, work / "grpo", gcfg, backend=backend, progress=False)
            dg = g.diagnostics
            table.append({"stage": "grpo", "steps": g.steps, "episodes": g.episodes, "verdicts": g.verdicts,
                          "hacks_with_positive_reward": g.hacks_with_positive_reward,
                          "rewards": [round(x, 3) for x in g.rewards],
                          "update_logp_pos_mean": dg.get("update_logp_pos_mean"),
                          "update_logp_neg_mean": dg.get("update_logp_neg_mean"),
                          "update_agreement_mean": dg.get("update_agreement_mean"),
                          "overshooting_steps": sum("overshoots" in x for x in g.warnings), "wall_s": w, "cpu_s": c})
            if args.score_grpo_train:
                score("grpo grpo-train tasks", g.checkpoint_path, gtrain)
            score(f"grpo heldout d{args.grpo_difficulty}", g.checkpoint_path, gheld)
            if args.grpo_difficulty != args.difficulty:
                score(f"grpo heldout d{args.difficulty}", g.checkpoint_path, held)
    _print(args, table)


def _teacher_and_sft(args, held, backend, table, score) -> str:
    """Reference-teacher rollouts, the tiny base (scored), SFT on the teacher's passes (scored); the SFT path."""
    from agents.reference import ReferencePolicy
    from agents.rollout import rollout
    from tasks import arithmetic
    from training.config import SFTConfig
    from training.sft import train_sft
    from training.tiny import build_tiny_model, n_parameters, task_corpus
    from training.warmup import warm_up_copying

    work = Path(args.work)
    train = arithmetic.generate(args.train_tasks, split="train", seed=args.seed, difficulty=args.difficulty)
    rows: list = []
    _, w, c = _timed(lambda: asyncio.run(rollout(train, ReferencePolicy(), backend, run_id="bench", concurrency=8,
                                                 on_rows=rows.extend, batch_size=len(train), progress=False)))
    teacher = [r for r in rows if r.verdict == "pass"]
    table.append({"stage": "teacher rollouts", "episodes": len(rows), "passes": len(teacher), "wall_s": w,
                  "cpu_s": c})
    if args.sft_no_tool_share:
        teacher, n = _without_tool(teacher, args.sft_no_tool_share, args.seed)
        table.append({"stage": "demos without the tool", "replaced": n, "of": len(teacher), "wall_s": 0.0,
                      "cpu_s": 0.0})
    if args.sft_base:
        base = args.sft_base
    else:
        base, w, c = _timed(build_tiny_model, work / "base", task_corpus(train), hidden=args.hidden,
                            layers=args.layers, heads=4, kv_heads=2, seed=args.seed)
        table.append({"stage": "build tiny", "params": n_parameters(base), "wall_s": w, "cpu_s": c})
        warm, w, c = _timed(warm_up_copying, base, [t.prompt for t in train], steps=args.copy_warmup_steps,
                            seed=args.seed)
        table.append({"stage": "copy warm-up", "steps": warm.steps, "final_loss": warm.final_loss, "wall_s": w,
                      "cpu_s": c})
    score("base heldout", base, held)
    cfg = SFTConfig(max_steps=args.sft_steps, learning_rate=args.lr, weight_decay=args.weight_decay,
                    batch_size=args.batch, seed=args.seed)
    sft, w, c = _timed(train_sft, base, teacher, work / "sft", cfg, progress=False)
    table.append({"stage": "sft", "steps": sft.steps, "examples": sft.n_examples,
                  "dropped": sft.n_dropped_truncated + sft.n_dropped_malformed, "final_loss": sft.losses[-1],
                  "wall_s": w, "cpu_s": c})
    score("sft heldout", sft.checkpoint_path, held)
    return sft.checkpoint_path


def _without_tool(rows: list, share: float, seed: int) -> tuple[list, int]:
    """A seeded `share` of the rows rewritten as [system, user, the final answer] (no tool call); how many."""
    import random

    from warehouse.record import Message

    rng, out, n = random.Random(seed), [], 0
    for r in rows:
        if rng.random() < share:
            msgs = [r.messages[0], r.messages[1], Message(role="assistant", content=r.messages[-1].content)]
            r, n = r.model_copy(update={"messages": msgs}), n + 1
        out.append(r)
    return out, n


def _print(args, table: list[dict]) -> None:
    print(f"{'stage':<26} {'pass':>6} {'reward':>7} {'wall_s':>8} {'cpu_s':>7}  other")
    for r in table:
        other = {k: v for k, v in r.items() if k not in ("stage", "pass_rate", "mean_reward", "wall_s", "cpu_s")}
        pr = f"{r['pass_rate']:.1%}" if "pass_rate" in r else ""
        mr = f"{r['mean_reward']:.3f}" if "mean_reward" in r else ""
        print(f"{r['stage']:<26} {pr:>6} {mr:>7} {r['wall_s']:>8.1f} {r['cpu_s']:>7.1f}  {json.dumps(other)}")
    base_r = next((r for r in table if r["stage"] == "base heldout"), None)
    sft_r = next((r for r in table if r["stage"] == "sft heldout"), None)
    if base_r and sft_r:
        print(f"held-out pass: base {base_r['pass_rate']:.0%} -> SFT {sft_r['pass_rate']:.0%}")
    for suffix in ("", f" T={args.eval_temperature:g} x{args.eval_samples}"):
        before = next((r for r in table if r["stage"] == f"sft heldout{suffix}"), None)
        after = next((r for r in table if r["stage"] == f"grpo heldout d{args.grpo_difficulty}{suffix}"), None)
        if before and after and args.grpo_difficulty == args.difficulty:
            hacks = [x["verdicts"].get("hack", 0) for x in (before, after)]
            print(f"held-out{suffix or ' greedy'}: mean reward SFT {before['mean_reward']:.3f} -> GRPO "
                  f"{after['mean_reward']:.3f}; hack verdicts {hacks[0]} -> {hacks[1]}")
    Path(args.out).write_text(json.dumps({"args": vars(args), "table": table}, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
